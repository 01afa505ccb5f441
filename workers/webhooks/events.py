"""The events webhooks deliver, and where: a request's terminal status to the request's
`webhook_url`, or a batch's terminal status to its team's `webhook_url`.

Request events carry the request object (`request.succeeded|failed|cancelled|rejected`).
Batch events have OpenAI's batch webhook shape (`batch.completed|failed|expired|cancelled`,
`data: {"id"}`), so `openai.OpenAI(webhook_secret=...).webhooks.unwrap` parses them into its
event types.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from domain import request_store
from domain.models import Batch, InferenceRequest, Team

__all__ = ["Event", "event_id", "load_event"]

BATCH_EVENT_PREFIX = "batch."


@dataclass(frozen=True, slots=True)
class Event:
    id: str  # the webhook-id header: the same for every attempt
    url: str
    payload: dict[str, Any]
    # The webhook_deliveries column naming what the event is about: request_id or batch_id.
    subject: dict[str, str]
    team_id: str | None  # whose signing secrets sign it (None: a request from before teams)


def event_id(subject_id: str, event_type: str) -> str:
    """Stable across retries and redeliveries, so receivers can drop duplicates."""
    return "msg_" + hashlib.sha256(f"{subject_id}:{event_type}".encode()).hexdigest()[:32]


def load_event(session: Session, subject_id: str, event_type: str) -> Event | None:
    """The event to deliver, or None when there is nowhere to deliver it."""
    if event_type.startswith(BATCH_EVENT_PREFIX):
        return _batch_event(session, subject_id, event_type)
    return _request_event(session, subject_id, event_type)


def _request_event(session: Session, request_id: str, event_type: str) -> Event | None:
    request = session.get(InferenceRequest, request_id)
    if request is None or not request.webhook_url:
        return None
    msg_id = event_id(request_id, event_type)
    payload = {"id": msg_id, "object": "event", "type": event_type,
               "created_at": int(time.time()), "data": request_store.request_to_dict(request)}
    return Event(msg_id, request.webhook_url, payload, {"request_id": request_id},
                 request.team_id)


def _batch_event(session: Session, batch_id: str, event_type: str) -> Event | None:
    batch = session.get(Batch, batch_id)
    team = None if batch is None else session.get(Team, batch.team_id)
    if batch is None or team is None or not team.webhook_url:
        return None
    msg_id = event_id(batch_id, event_type)
    # OpenAI's created_at: when the batch reached the status the event announces.
    reached = getattr(batch, f"{event_type.removeprefix(BATCH_EVENT_PREFIX)}_at", None)
    payload = {"id": msg_id, "object": "event", "type": event_type,
               "created_at": int((reached or batch.updated_at).timestamp()),
               "data": {"id": batch_id}}
    return Event(msg_id, team.webhook_url, payload, {"batch_id": batch_id}, team.id)
