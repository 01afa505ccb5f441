"""One delivery attempt of a webhook event: signed POST, recorded in `webhook_deliveries`."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx
from sqlalchemy import case, func, select

from app.db import Database
from app.models import WebhookDelivery
from app.settings import Settings
from workers.webhooks.events import load_event
from workers.webhooks.secret import webhook_secret
from workers.webhooks.signing import signed_headers

__all__ = ["Attempt", "attempt_delivery"]


@dataclass(frozen=True, slots=True)
class Attempt:
    event_id: str
    succeeded: bool
    number: int  # 1 for the first POST of this event


def attempt_delivery(db: Database, settings: Settings, subject_id: str, event_type: str
                     ) -> Attempt | None:
    """POST the event once and record the attempt; None when there is nothing to deliver (no
    URL, or the subject is gone). An event already delivered (its message was sent twice) is
    not posted again."""
    with db.session() as session:
        event = load_event(session, subject_id, event_type)
        if event is None:
            return None
        made, delivered = session.execute(
            select(func.count(), func.coalesce(func.max(case((WebhookDelivery.succeeded, 1),
                                                             else_=0)), 0))
            .where(WebhookDelivery.event_id == event.id)
        ).one()
    attempt = made + 1
    if delivered:
        return Attempt(event.id, True, made)
    body = json.dumps(event.payload).encode()
    headers = signed_headers(webhook_secret(settings), event.id, int(time.time()), body)
    status_code, error, elapsed_ms = _post(event.url, body, headers,
                                           timeout_s=settings.webhook_timeout_s)
    succeeded = status_code is not None and 200 <= status_code < 300
    with db.session() as session:
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
    return Attempt(event.id, succeeded, attempt)


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
