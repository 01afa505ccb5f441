"""One delivery attempt of a webhook event: signed POST, recorded in `webhook_deliveries`."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpcore
from sqlalchemy import case, func, select

from domain.db import Database
from domain.models import WebhookDelivery
from domain.settings import Settings
from workers.webhooks.events import load_event
from workers.webhooks.secret import signing_secrets
from workers.webhooks.signing import signed_headers
from workers.webhooks.transport import DestinationRefused, post

__all__ = ["Attempt", "attempt_delivery"]

ERROR_LIMIT = 500  # characters of an error kept in webhook_deliveries.error


@dataclass(frozen=True, slots=True)
class Attempt:
    event_id: str
    succeeded: bool
    number: int  # 1 for the first POST of this event
    permanent: bool = False  # refused destination: no further attempt


@dataclass(frozen=True, slots=True)
class _Result:
    status_code: int | None
    error: str | None
    permanent: bool
    elapsed_ms: float


def attempt_delivery(db: Database, settings: Settings, subject_id: str, event_type: str
                     ) -> Attempt | None:
    """POST the event once and record the attempt; None when there is nothing to deliver (no
    URL, or the subject is gone). An event already delivered (its message was sent twice), or
    whose destination was refused, is not posted again."""
    with db.session() as session:
        event = load_event(session, subject_id, event_type)
        if event is None:
            return None
        made, delivered, refused = session.execute(
            select(func.count(), _any(WebhookDelivery.succeeded), _any(WebhookDelivery.permanent))
            .where(WebhookDelivery.event_id == event.id)
        ).one()
        if delivered or refused:
            return Attempt(event.id, bool(delivered), made, permanent=bool(refused))
        secrets = signing_secrets(session, settings, event.team_id)
    body = json.dumps(event.payload).encode()
    headers = signed_headers(secrets, event.id, int(time.time()), body)
    result = _post(event.url, body, headers, settings)
    succeeded = result.status_code is not None and 200 <= result.status_code < 300
    with db.session() as session:
        session.add(
            WebhookDelivery(
                **event.subject,
                event_id=event.id,
                event_type=event_type,
                url=event.url,
                attempt=made + 1,
                status_code=result.status_code,
                error=result.error,
                succeeded=succeeded,
                permanent=result.permanent,
                duration_ms=result.elapsed_ms,
            )
        )
    return Attempt(event.id, succeeded, made + 1, permanent=result.permanent)


def _any(column: Any) -> Any:
    return func.coalesce(func.max(case((column, 1), else_=0)), 0)


def _post(url: str, body: bytes, headers: dict[str, str], settings: Settings) -> _Result:
    started = time.perf_counter()
    status: int | None = None
    permanent = False
    try:
        response = post(url, body, headers, allowed=settings.webhook_allowed_networks,
                        deadline_s=settings.webhook_timeout_s)
    except DestinationRefused as exc:
        error, permanent = f"refused: {exc}", True
    except httpcore.TimeoutException as exc:
        error = f"timeout: no answer within the {settings.webhook_timeout_s:g} s deadline ({exc})"
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol,
            ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    else:
        status, error = response.status_code, None
        if 300 <= status < 400:
            error = f"redirect to {response.location} not followed"
        elif not 200 <= status < 300:
            error = response.body.decode("utf-8", "replace")
    return _Result(status, error and error[:ERROR_LIMIT], permanent,
                   (time.perf_counter() - started) * 1000)
