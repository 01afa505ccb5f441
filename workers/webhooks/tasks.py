"""Celery task that delivers one webhook event, retrying with exponential backoff."""

from __future__ import annotations

import json
import logging
import time

import httpx
from celery import Task, shared_task

from app import dispatch
from app.models import WebhookDelivery
from workers import runtime
from workers.webhooks.events import load_event
from workers.webhooks.secret import webhook_secret
from workers.webhooks.signing import signed_headers

logger = logging.getLogger(__name__)


@shared_task(name=dispatch.TASK_WEBHOOK, bind=True, max_retries=None)
def deliver(self: Task, subject_id: str, event_type: str) -> None:
    """Deliver one event about a request (`request.*`) or a batch (`batch.*`), signed; every
    attempt is recorded, failed ones are retried with exponential backoff."""
    rt = runtime.get()
    settings = rt.settings
    attempt = self.request.retries + 1
    with rt.db.session() as session:
        event = load_event(session, subject_id, event_type)
    if event is None:
        return
    body = json.dumps(event.payload).encode()
    headers = signed_headers(webhook_secret(settings), event.id, int(time.time()), body)
    status_code, error, elapsed_ms = _post(event.url, body, headers,
                                           timeout_s=settings.webhook_timeout_s)
    succeeded = status_code is not None and 200 <= status_code < 300
    with rt.db.session() as session:
        session.add(
            WebhookDelivery(
                **event.subject,
                event_id=event.id,
                event_type=event_type,
                url=event.url,
                attempt=attempt,
                status_code=status_code,
                error=error,
                succeeded=succeeded,
                duration_ms=elapsed_ms,
            )
        )
    if succeeded:
        return
    if attempt >= settings.webhook_max_attempts:
        logger.warning("webhook %s for %s gave up after %d attempts", event.id, subject_id,
                       attempt)
        return
    raise self.retry(countdown=settings.webhook_backoff_s * 2 ** (attempt - 1))


def _post(
    url: str, body: bytes, headers: dict[str, str], *, timeout_s: float
) -> tuple[int | None, str | None, float]:
    started = time.perf_counter()
    try:
        response = httpx.post(url, content=body, headers=headers, timeout=timeout_s)
        status, error = response.status_code, None if response.is_success else response.text[:500]
    except httpx.HTTPError as exc:
        status, error = None, f"{type(exc).__name__}: {exc}"[:500]
    return status, error, (time.perf_counter() - started) * 1000
