"""Celery task of the serve stage: run one request on this worker's engine."""

from __future__ import annotations

from celery import shared_task

from app import dispatch
from workers.serve.lifecycle import current_host


@shared_task(name=dispatch.TASK_GENERATE)
def generate(request_id: str, attempt: int) -> None:
    """Blocks this pool thread until the engine finishes the request; acknowledged after."""
    current_host().run(request_id, attempt)
