"""Webhook events that should be on their way and are not: a terminal request (or batch) with a
webhook URL, no successful delivery, attempts left, and its next attempt overdue. The event's
message was lost after the outbox sent it (a retry the broker refused while Redis restarted, a
webhook worker killed holding it); the sweep sends it again, and the delivery task never posts
an event twice once it was delivered."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import case, func, or_, select
from sqlalchemy.orm import Session

from domain.batches import EVENT_TYPES, TERMINAL_BATCH_STATUSES
from domain.models import (
    TERMINAL_STATUSES,
    Batch,
    BatchStatus,
    InferenceRequest,
    Team,
    WebhookDelivery,
)

__all__ = ["WebhookPolicy", "overdue_events"]

#: Events older than this are left alone: their receivers have had every chance.
WINDOW = timedelta(hours=24)


class WebhookPolicy:
    """When the next attempt of an event is due: `backoff_s` doubling after each failed one,
    plus `grace_s` for the task in flight to make it."""

    def __init__(self, *, backoff_s: float, max_attempts: int, grace_s: float) -> None:
        self.backoff_s = backoff_s
        self.max_attempts = max_attempts
        self.grace_s = grace_s

    def overdue(self, made: int, last: datetime, now: datetime) -> bool:
        if made >= self.max_attempts:
            return False
        wait_s = self.backoff_s * 2 ** (made - 1) if made else 0.0
        return now - last > timedelta(seconds=wait_s + self.grace_s)


def overdue_events(session: Session, policy: WebhookPolicy, now: datetime
                   ) -> list[tuple[str, str]]:
    """(subject id, event type) of the events whose next attempt is overdue."""
    return [*_overdue_requests(session, policy, now), *_overdue_batches(session, policy, now)]


def _delivered() -> object:
    """1 when an attempt succeeded, or found the destination refused (no retry then either)."""
    settled = or_(WebhookDelivery.succeeded, WebhookDelivery.permanent)
    return func.coalesce(func.max(case((settled, 1), else_=0)), 0)


def _overdue_requests(session: Session, policy: WebhookPolicy, now: datetime
                      ) -> list[tuple[str, str]]:
    r, d = InferenceRequest, WebhookDelivery
    rows = session.execute(
        select(r.id, r.status, r.finished_at, func.count(d.id), func.max(d.at))
        .outerjoin(d, d.request_id == r.id)
        .where(r.status.in_([str(s) for s in TERMINAL_STATUSES]), r.webhook_url.is_not(None),
               r.finished_at > now - WINDOW)
        .group_by(r.id, r.status, r.finished_at)
        .having(_delivered() == 0)
    ).all()
    return [(request_id, f"request.{status}")
            for request_id, status, finished_at, made, last in rows
            if policy.overdue(made, last or finished_at, now)]


def _overdue_batches(session: Session, policy: WebhookPolicy, now: datetime
                     ) -> list[tuple[str, str]]:
    b, d = Batch, WebhookDelivery
    rows = session.execute(
        select(b.id, b.status, b.updated_at, func.count(d.id), func.max(d.at))
        .join(Team, Team.id == b.team_id)
        .outerjoin(d, d.batch_id == b.id)
        .where(b.status.in_([str(s) for s in TERMINAL_BATCH_STATUSES]),
               Team.webhook_url.is_not(None), b.updated_at > now - WINDOW)
        .group_by(b.id, b.status, b.updated_at)
        .having(_delivered() == 0)
    ).all()
    return [(batch_id, EVENT_TYPES[BatchStatus(status)])
            for batch_id, status, updated_at, made, last in rows
            if policy.overdue(made, last or updated_at, now)]
