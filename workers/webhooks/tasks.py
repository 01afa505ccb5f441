"""Celery task that delivers one webhook event, retrying with exponential backoff (one attempt
is `delivery.attempt_delivery`)."""

from __future__ import annotations

import logging

from celery import Task, shared_task

from domain import dispatch
from workers import runtime
from workers.retries import ON_OUTAGE
from workers.webhooks.delivery import attempt_delivery

logger = logging.getLogger(__name__)


@shared_task(name=dispatch.TASK_WEBHOOK, bind=True, **ON_OUTAGE)
def deliver(self: Task, subject_id: str, event_type: str) -> None:
    """Deliver one event about a request (`request.*`) or a batch (`batch.*`), signed; every
    attempt is recorded, failed ones are retried with exponential backoff."""
    rt = runtime.get()
    settings = rt.settings
    outcome = attempt_delivery(rt.db, settings, subject_id, event_type)
    if outcome is None or outcome.succeeded:
        return
    if outcome.permanent:
        logger.warning("webhook %s for %s not sent: its destination is refused (see "
                       "webhook_deliveries.error)", outcome.event_id, subject_id)
        return
    if outcome.number >= settings.webhook_max_attempts:
        logger.warning("webhook %s for %s gave up after %d attempts", outcome.event_id,
                       subject_id, outcome.number)
        return
    raise self.retry(countdown=settings.webhook_backoff_s * 2 ** (outcome.number - 1))
