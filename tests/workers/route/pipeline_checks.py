"""What the routing tests look at after a stage ran: a request's events, the outbox, a queue."""

from __future__ import annotations

from sqlalchemy import select

from domain.db import Database
from domain.models import OutboxEntry, RequestEvent
from domain.outbox import Outbox
from domain.queues import request_ids_in_broker
from workers.runtime import Runtime


def events(db: Database, request_id: str) -> list[str]:
    """The statuses of the request's history, in order."""
    with db.session() as session:
        return list(session.scalars(select(RequestEvent.status).where(
            RequestEvent.request_id == request_id).order_by(RequestEvent.id)))


def outbox_tasks(db: Database, outbox: Outbox) -> list[str]:
    """Entries left once this process's deletes of sent entries (its own thread) are done."""
    assert outbox.flush()
    with db.session() as session:
        return list(session.scalars(select(OutboxEntry.task)))


def in_queue(rt: Runtime, queue: str) -> set[str]:
    """The requests some message waiting in `queue` concerns."""
    return request_ids_in_broker(rt.redis, [queue], fresh_s=0)
