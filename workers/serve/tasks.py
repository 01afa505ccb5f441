"""Celery task of the serve stage: run one request on this worker's engine."""

from __future__ import annotations

from celery import shared_task

from domain import dispatch
from workers.retries import ON_OUTAGE
from workers.serve.lifecycle import current_host


# NOTE: the engine keeps recent results by request id, so a retry after generation does not
# generate twice.
@shared_task(name=dispatch.TASK_GENERATE, **ON_OUTAGE)
def generate(request_id: str, attempt: int) -> None:
    """Blocks this pool thread until the engine finishes the request; acknowledged after."""
    current_host().run(request_id, attempt)
