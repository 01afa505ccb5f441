"""The transactional outbox: every task message that must follow a commit is written in that
transaction, sent right after the commit, and deleted once sent. What a crash or a broker outage
leaves behind, the relay (run by the health worker every `outbox_relay_interval_s`) sends later.

Delivery is at least once (a crash between the send and the delete sends again), so every
consumer is idempotent: status transitions are conditional, completions check the attempt, and
webhook events carry one id across every attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

from celery import Celery
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app import faults
from app.db import Database
from app.dispatch import Message
from app.models import OutboxEntry, utcnow

__all__ = ["Outbox", "OutboxTransaction"]

logger = logging.getLogger(__name__)


@dataclass
class OutboxTransaction:
    """A database transaction that may stage messages to send once it committed."""

    session: Session
    entries: list[OutboxEntry] = field(default_factory=list)

    def post(self, message: Message) -> None:
        entry = OutboxEntry(task=message.task, queue=message.queue, args=list(message.args),
                            kwargs=dict(message.kwargs), priority=message.priority)
        self.session.add(entry)
        self.entries.append(entry)


class Outbox:
    """Stages messages in transactions of `db` and sends them through `celery`."""

    def __init__(self, db: Database, celery: Celery) -> None:
        self.db = db
        self.celery = celery

    @contextmanager
    def transaction(self) -> Iterator[OutboxTransaction]:
        """A transaction (committed on success) whose posted messages are sent after commit."""
        with self.db.session() as session:
            tx = OutboxTransaction(session)
            yield tx
        if tx.entries:
            faults.crash_after_commit()
            self._send_committed(tx.entries)

    def _send_committed(self, entries: list[OutboxEntry]) -> None:
        """Send now without the broker's publish retries (the relay retries), then delete."""
        sent: list[int] = []
        for entry in entries:
            try:
                _message(entry).send(self.celery, retry=False)
            except Exception as exc:  # noqa: BLE001 - the relay sends what is left
                logger.warning("broker unavailable (%s): %d message(s) left to the outbox relay",
                               type(exc).__name__, len(entries) - len(sent))
                break
            sent.append(entry.id)
        self._forget(sent)

    def _forget(self, entry_ids: list[int]) -> None:
        if not entry_ids:
            return
        try:
            with self.db.session() as session:
                session.execute(delete(OutboxEntry).where(OutboxEntry.id.in_(entry_ids)))
        except Exception as exc:  # noqa: BLE001 - the relay sends them again: consumers dedupe
            logger.warning("could not delete %d sent outbox entries (%s)", len(entry_ids),
                           type(exc).__name__)

    def relay(self, *, older_than_s: float, limit: int = 1000) -> int:
        """Send entries staged more than `older_than_s` ago (their own sender crashed or met a
        broker outage), oldest first; returns how many were sent. Concurrent relays skip each
        other's rows."""
        cutoff = utcnow() - timedelta(seconds=older_than_s)
        sent: list[int] = []
        with self.db.session() as session:
            entries = session.scalars(
                select(OutboxEntry).where(OutboxEntry.created_at < cutoff)
                .order_by(OutboxEntry.id).limit(limit).with_for_update(skip_locked=True)
            ).all()
            for entry in entries:
                try:
                    _message(entry).send(self.celery)
                except Exception as exc:  # noqa: BLE001 - the broker is down: next round
                    logger.warning("outbox relay: broker unavailable (%s); %d entries wait",
                                   type(exc).__name__, len(entries) - len(sent))
                    break
                sent.append(entry.id)
            if sent:
                session.execute(delete(OutboxEntry).where(OutboxEntry.id.in_(sent)))
        return len(sent)

    def pending_request_ids(self) -> set[str]:
        """First arguments of the staged messages: the requests (or batches) they concern."""
        with self.db.session() as session:
            rows = session.scalars(select(OutboxEntry.args)).all()
        return {args[0] for args in rows if args and isinstance(args[0], str)}


def _message(entry: OutboxEntry) -> Message:
    return Message(entry.task, entry.queue, tuple(entry.args), dict(entry.kwargs),
                   entry.priority)
