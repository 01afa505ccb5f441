"""Celery task of the serve stage: run one request on this worker's engine."""

from __future__ import annotations

import redis
from celery import shared_task
from sqlalchemy.exc import OperationalError

from app import dispatch
from workers.serve.lifecycle import current_host


@shared_task(
    name=dispatch.TASK_GENERATE,
    # A database or Redis outage while admitting or completing: try again. The engine keeps
    # recent results by request id, so a retry after generation does not generate twice.
    autoretry_for=(OperationalError, redis.ConnectionError),
    retry_backoff=True,
    retry_backoff_max=30,
    max_retries=20,
)
def generate(request_id: str, attempt: int) -> None:
    """Blocks this pool thread until the engine finishes the request; acknowledged after."""
    current_host().run(request_id, attempt)
