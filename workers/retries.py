"""Retry options of tasks whose message is the only thing carrying their request forward."""

from __future__ import annotations

from typing import Any

import redis

from domain.db import TRANSIENT_ERRORS

__all__ = ["ON_OUTAGE"]

#: A database or Redis outage: try again with backoff (1 s doubling to 30 s, jittered) for as
#: long as it lasts. Every such task is idempotent, and the stranded-request sweep would find
#: the request anyway: retrying only brings it back sooner.
ON_OUTAGE: dict[str, Any] = {
    "autoretry_for": (*TRANSIENT_ERRORS, redis.ConnectionError),
    "retry_backoff": True,
    "retry_backoff_max": 30,
    "max_retries": None,
}
