"""Redis locks that keep periodic or redelivered work single (one batch releaser, one worker per
batch, one length-model retrain per served model).

Tasks are delivered at least once and beat may fire while a slow run is still going; a task
that cannot take its lock returns at once, since whoever holds it does the same work. Locks
expire (TTL), so a worker killed while holding one blocks nothing for long.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.exceptions import LockError

__all__ = ["held"]

logger = logging.getLogger(__name__)


@contextmanager
def held(client: redis.Redis, name: str, *, ttl_s: float) -> Iterator[bool]:
    """Yields whether the lock was free and is now ours; released on exit."""
    lock = client.lock(name, timeout=ttl_s)
    if not lock.acquire(blocking=False):
        yield False
        return
    try:
        yield True
    finally:
        try:
            lock.release()
        except LockError:  # expired meanwhile: the work is done, nothing left to release
            logger.warning("lock %s expired before its holder finished", name)
