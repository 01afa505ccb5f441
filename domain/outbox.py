"""The transactional outbox: every task message that must follow a commit is written in that
transaction, sent right after the commit, and deleted once sent. What a crash or a broker outage
leaves behind, the relay (run by the health worker every `outbox_relay_interval_s`) sends later.

The deletes of sent entries are off the sender's path: a thread of the process deletes them in
batches (one statement for every entry sent meanwhile, committed without waiting for the WAL
flush), so that an accepted request costs its sender one transaction, not two. An entry whose
delete is lost (crash, database outage) is sent again by the relay once it is
`outbox_relay_after_s` old: the same at-least-once delivery as a crash between send and delete.

In the API (`Outbox(..., send_in_background=True)`), the send after the commit is itself off the
request's path: a daemon thread (a greenlet under gevent) sends what the requests committed, so
that an accepted request is answered right after its commit whatever the broker does. A broker
that is down made each accept wait out kombu's connection retries (about 6 s); now the sender
meets the outage, leaves the entries to the relay, and for `BROKER_DOWN_BACKOFF_S` leaves new
ones to the relay at once rather than meeting it again for each.

Delivery is at least once (a crash between the send and the delete sends again), so every
consumer is idempotent: status transitions are conditional, completions check the attempt, and
webhook events carry one id across every attempt.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

from celery import Celery
from sqlalchemy import bindparam, delete, func, insert, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import Executable

from domain import faults
from domain.db import Database
from domain.dispatch import Message
from domain.models import OutboxEntry, utcnow

__all__ = ["Outbox", "OutboxTransaction"]

logger = logging.getLogger(__name__)

#: How long the delete thread lets sent entries gather before one delete takes them all.
#: NOTE: far below `outbox_relay_after_s` (the age at which the relay would send an entry
#: again), and long enough that at a few requests a second one delete takes several entries.
FORGET_LINGER_S = 0.2
#: Most entries one delete statement takes.
FORGET_BATCH = 1000
#: After the background sender met a broker outage, how long it leaves new entries to the relay
#: without trying.
BROKER_DOWN_BACKOFF_S = 2.0


@dataclass
class OutboxTransaction:
    """A database transaction that may stage messages to send once it committed."""

    session: Session
    messages: list[Message] = field(default_factory=list)
    #: After the commit: the deferred entries (see `post`), to send or retire.
    deferred: list[tuple[int, Message]] = field(default_factory=list)
    _defer: set[int] = field(default_factory=set)  # indices in `messages`

    def post(self, message: Message, *, defer: bool = False) -> None:
        """Send `message` once the transaction committed. `defer`: staged, but not sent after
        the commit: its committer sends it (`Outbox.send`) or retires it in a later transaction
        that did what it asks for (`retire`); one it did neither with (a crash) the relay
        sends."""
        if defer:
            self._defer.add(len(self.messages))
        self.messages.append(message)

    def keep_deferred(self, staged: list[tuple[int, Message]]) -> list[tuple[int, Message]]:
        """Of the staged entries (in posting order), keep the deferred ones in `deferred`;
        the others, to send now."""
        self.deferred = [entry for i, entry in enumerate(staged) if i in self._defer]
        return [entry for i, entry in enumerate(staged) if i not in self._defer]

    def retire(self, entry_ids: Sequence[int]) -> None:
        """Delete deferred entries in this transaction: it does what they ask for."""
        if entry_ids:
            self.session.execute(delete(_OUTBOX).where(_OUTBOX.c.id.in_(list(entry_ids))))

    def stage(self) -> list[tuple[int, Message]]:
        """Write the posted messages into the outbox, in the transaction, before its commit:
        one INSERT for all of them (Core, not the ORM's unit of work); (entry id, message)."""
        if not self.messages:
            return []
        now = utcnow()
        rows = [{"task": m.task, "queue": m.queue, "args": list(m.args),
                 "kwargs": dict(m.kwargs), "priority": m.priority, "created_at": now}
                for m in self.messages]
        ids = self.session.execute(
            insert(_OUTBOX).returning(_OUTBOX.c.id, sort_by_parameter_order=True), rows
        ).scalars().all()
        return list(zip(ids, self.messages, strict=True))


class Outbox:
    """Stages messages in transactions of `db` and sends them through `celery`."""

    def __init__(self, db: Database, celery: Celery, *, send_in_background: bool = False
                 ) -> None:
        """`send_in_background`: committed messages are sent by a thread of the process, not by
        the committer (the API: see the module docstring)."""
        self.db = db
        self.celery = celery
        self._forgetter = _Forgetter(db)
        self._sender = _BackgroundSender(self._send_now) if send_in_background else None

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until the entries this process committed are sent (or left to the relay) and
        the sent ones deleted (or their delete failed); whether that happened within
        `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        if self._sender is not None and not self._sender.flush(timeout_s):
            return False
        return self._forgetter.flush(max(0.0, deadline - time.monotonic()))

    @contextmanager
    def transaction(self) -> Iterator[OutboxTransaction]:
        """A transaction (committed on success) whose posted messages are sent after commit."""
        with self.db.session() as session:
            tx = OutboxTransaction(session)
            yield tx
            staged = tx.stage()
        if staged:
            faults.crash_after_commit()
            now = tx.keep_deferred(staged)
            if now:
                self._send_committed(now)

    def send(self, entries: list[tuple[int, Message]]) -> None:
        """Send committed entries that were deferred (`OutboxTransaction.post(defer=True)`)."""
        self._send_committed(entries)

    def _send_committed(self, entries: list[tuple[int, Message]]) -> None:
        if self._sender is not None:
            self._sender.add(entries)
        else:
            self._send_now(entries)

    def _send_now(self, entries: list[tuple[int, Message]]) -> bool:
        """Send without the broker's publish retries (the relay retries), then delete; whether
        every entry was sent."""
        sent: list[int] = []
        for entry_id, message in entries:
            try:
                message.send(self.celery, retry=False)
            except Exception as exc:  # noqa: BLE001 - the relay sends what is left
                logger.warning("broker unavailable (%s): %d message(s) left to the outbox relay",
                               type(exc).__name__, len(entries) - len(sent))
                break
            sent.append(entry_id)
        self._forgetter.add(sent)
        return len(sent) == len(entries)

    def relay(self, *, older_than_s: float, limit: int = 1000) -> int:
        """Send entries staged more than `older_than_s` ago (their own sender crashed or met a
        broker outage), oldest first; returns how many were sent. Concurrent relays skip each
        other's rows."""
        self.flush()  # what this process sent is not sent again
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
        self.flush()
        with self.db.session() as session:
            rows = session.scalars(select(OutboxEntry.args)).all()
        return {args[0] for args in rows if args and isinstance(args[0], str)}


_OUTBOX = OutboxEntry.__table__
#: The delete of sent entries; on PostgreSQL its commit does not wait for the WAL flush (a lost
#: delete is only a resend, which consumers dedupe), set by the statement itself.
_FORGET = delete(_OUTBOX).where(_OUTBOX.c.id.in_(bindparam("ids", expanding=True)))
_FORGET_NO_WAL_WAIT = select(func.set_config("synchronous_commit", "off", True)).add_cte(
    _FORGET.cte("forgotten"))


def _forget_statement(dialect: str) -> Executable:
    return _FORGET_NO_WAL_WAIT if dialect == "postgresql" else _FORGET


def _message(entry: OutboxEntry) -> Message:
    return Message(entry.task, entry.queue, tuple(entry.args), dict(entry.kwargs),
                   entry.priority)


class _DaemonLoop:
    """A daemon thread running `_run`, started on first use, and again in a forked child
    (threads do not fork); `_cond` guards the subclass's state."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def _run_locked(self) -> None:
        """Start the thread unless it runs in this process (call with `_cond` held)."""
        if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def _running_here(self) -> bool:
        return self._thread is not None and self._pid == os.getpid()

    def _run(self) -> None:
        raise NotImplementedError


class _BackgroundSender(_DaemonLoop):
    """Sends committed entries from a daemon thread of its own (module docstring)."""

    def __init__(self, send: Callable[[list[tuple[int, Message]]], bool]) -> None:
        super().__init__("outbox-send")
        self._send = send
        # --- guarded by _cond ---
        self._pending: list[tuple[int, Message]] = []
        self._busy = False
        self._down_until = 0.0  # monotonic time before which new entries go to the relay

    def add(self, entries: list[tuple[int, Message]]) -> None:
        with self._cond:
            if time.monotonic() < self._down_until:
                return  # the broker was down a moment ago: the relay sends them
            self._pending.extend(entries)
            self._run_locked()
            self._cond.notify_all()

    def flush(self, timeout_s: float) -> bool:
        with self._cond:
            if not self._running_here():
                return True
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._pending))
                batch, self._pending = self._pending, []
                self._busy = True
            try:
                all_sent = self._send(batch)
            except Exception:  # noqa: BLE001 - the relay sends what is left
                logger.exception("outbox sender: unexpected error; the relay sends the rest")
                all_sent = False
            with self._cond:
                self._busy = False
                if not all_sent:
                    self._down_until = time.monotonic() + BROKER_DOWN_BACKOFF_S
                    self._pending.clear()  # staged: the relay sends them
                self._cond.notify_all()


class _Forgetter(_DaemonLoop):
    """Deletes sent entries from a daemon thread of its own, in batches (module docstring)."""

    def __init__(self, db: Database) -> None:
        super().__init__("outbox-forget")
        self.db = db
        # --- guarded by _cond ---
        self._ids: list[int] = []
        self._busy = False  # a delete is running

    def add(self, entry_ids: list[int]) -> None:
        if not entry_ids:
            return
        with self._cond:
            self._ids.extend(entry_ids)
            self._run_locked()
            self._cond.notify_all()

    def flush(self, timeout_s: float) -> bool:
        with self._cond:
            if not self._running_here():
                return not self._ids
            return self._cond.wait_for(lambda: not self._ids and not self._busy, timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._ids))
            # Let entries sent right after these join their delete.
            time.sleep(FORGET_LINGER_S)
            with self._cond:
                batch, self._ids = self._ids[:FORGET_BATCH], self._ids[FORGET_BATCH:]
                self._busy = True
            try:
                self._delete(batch)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _delete(self, entry_ids: list[int]) -> None:
        try:
            # NOTE: one statement outside a transaction (Database.autocommit), not
            # BEGIN, SET LOCAL, DELETE, COMMIT: at a few requests a second most deletes take
            # one or two entries, so each was four round trips per request in every sender.
            with self.db.autocommit() as connection:
                connection.execute(_forget_statement(connection.dialect.name), {"ids": entry_ids})
        except Exception as exc:  # noqa: BLE001 - the relay sends them again: consumers dedupe
            logger.warning("could not delete %d sent outbox entries (%s)", len(entry_ids),
                           type(exc).__name__)
