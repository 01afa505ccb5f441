"""The sweep for stranded requests: a reconciliation of PostgreSQL against what holds work.

A request in flight always waits on one holder: a message (in the outbox, in the broker, or in a
worker's hands) or an engine. The sweep looks at every request in flight that has not changed
for `stranded_after_s` and finds its holder:

- routed to or running on an instance without a heartbeat: back to routing at once. If that
  instance comes back, its engine finds the request re-routed at its ownership check and aborts
  it, and the attempt check refuses whatever it writes;
- running on a live instance whose engine does not hold it (the worker restarted within the
  heartbeat TTL, or the admission never reached the engine): back to routing;
- queued, predicting or routed with no message anywhere (Redis restarted empty, a worker died
  holding it, a task gave up): the message of its stage is sent again.

The same holds for webhook events (`undelivered.py`): one overdue with no message is sent again.
These are acted on only when two sweeps in a row found them so: a message moves between the
broker's lists and a worker's hands, an admission reaches the engine's published state a moment
later. A message sent twice is harmless: every stage is idempotent.

The sweep also cleans what dead processes leave: assignments a router noted before a decision
it never committed, and messages a killed worker held about work finished since (kombu would
redeliver them after the visibility timeout, for nothing).
"""

from __future__ import annotations

import enum
import functools
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis
from sqlalchemy import select, update

from domain import dispatch, request_store
from domain.batches import TERMINAL_BATCH_STATUSES
from domain.db import Database
from domain.live_fleet import Fleet, InstanceStatus
from domain.models import (
    TERMINAL_STATUSES,
    Batch,
    InferenceRequest,
    Priority,
    RequestStatus,
    database_now,
    utcnow,
)
from domain.outbox import Outbox
from domain.queues import SERVICE_QUEUES, drop_unacked, request_ids_in_broker, stale_unacked
from workers.health.undelivered import WebhookPolicy, overdue_events
from workers.sim.engine_state import EngineState

__all__ = ["Findings", "InFlight", "Remedy", "Report", "Sweep", "diagnose"]

_ON_INSTANCE = (RequestStatus.ROUTED, RequestStatus.RUNNING)
_IN_FLIGHT = (RequestStatus.QUEUED, RequestStatus.PREDICTING, *_ON_INSTANCE)
#: Most requests one sweep looks at (oldest change first); the next sweep takes the rest.
_BATCH = 2000
_SUSPECTS_KEY = "blockq:sweep:suspects"


class Remedy(enum.StrEnum):
    REROUTE = "reroute"  # off its instance, back to routing (a new attempt)
    RESEND = "resend"  # its stage's message again (same attempt)


@dataclass(frozen=True, slots=True)
class InFlight:
    """What the sweep needs of a request in flight."""

    id: str
    status: RequestStatus
    instance_id: str | None
    attempt: int
    priority_rank: int
    predicted: bool

    def next_message(self) -> dispatch.Message:
        """The message its current stage waits for."""
        if self.status == RequestStatus.ROUTED:
            assert self.instance_id is not None
            return dispatch.generate(self.id, instance_id=self.instance_id,
                                     attempt=self.attempt, priority=self.priority_rank)
        if self.predicted:
            return dispatch.route(self.id, priority=self.priority_rank)
        return dispatch.predict(self.id, priority=self.priority_rank)


@dataclass(frozen=True, slots=True)
class Findings:
    """`now`: act on these at once; `suspects`: act if the next sweep finds them again."""

    now: dict[str, Remedy]
    suspects: dict[str, Remedy]


def diagnose(requests: Iterable[InFlight], holdings: dict[str, set[str]],
             messages: Callable[[], set[str]]) -> Findings:
    """Pure: each request against the engines' holdings (alive instance -> request ids its
    engine holds) and, only if needed, the requests some message concerns (`messages()`)."""
    now: dict[str, Remedy] = {}
    suspects: dict[str, Remedy] = {}
    unheld: list[InFlight] = []
    for request in requests:
        if request.status in _ON_INSTANCE and request.instance_id not in holdings:
            now[request.id] = Remedy.REROUTE
        elif request.status == RequestStatus.RUNNING:
            if request.id not in holdings[request.instance_id or ""]:
                suspects[request.id] = Remedy.REROUTE
        else:
            unheld.append(request)
    if unheld:
        with_message = messages()
        suspects.update({r.id: Remedy.RESEND for r in unheld if r.id not in with_message})
    return Findings(now, suspects)


@dataclass(frozen=True, slots=True)
class Report:
    rerouted: int
    resent: int
    webhooks_resent: int
    suspected: int  # found stranded once: acted on if the next sweep finds them again
    cleaned: int  # leftover assignments, and unacknowledged messages about finished work


class Sweep:
    """One sweep over the database, the fleet's published states, the broker and the outbox."""

    def __init__(self, outbox: Outbox, fleet: Fleet, broker: redis.Redis, webhooks: WebhookPolicy,
                 *, stranded_after_s: float, unacked_fresh_s: float, memory_s: float,
                 hold_limit_s: float = 0.0) -> None:
        """`hold_limit_s`: a request the router has held (late binding) for less than this
        counts as held; 0: none does (late binding off: nothing will release them)."""
        self.outbox = outbox
        self.fleet = fleet
        self.broker = broker
        self.webhooks = webhooks
        self.stranded_after_s = stranded_after_s
        self.unacked_fresh_s = unacked_fresh_s
        self.memory_s = memory_s
        self.hold_limit_s = hold_limit_s

    def run(self) -> Report:
        statuses = self.fleet.statuses()
        holdings = {s.instance_id: _held(s.state) for s in statuses if s.alive}
        requests = {r.id: r for r in self._unchanged_in_flight()}
        engine_queues = [s.instance_id for s in statuses]
        messages = functools.cache(lambda: self._with_message(engine_queues))
        findings = diagnose(requests.values(), holdings, messages)
        events = self._overdue_events(messages)
        # Sighting key -> a request id (its remedy in `findings`) or a webhook event.
        sightings: dict[str, str | tuple[str, str]] = {
            _sighting(requests[rid], remedy): rid for rid, remedy in findings.suspects.items()}
        sightings.update({f"webhook:{subject}:{kind}": (subject, kind) for subject, kind in events})
        confirmed = [sightings[key] for key in self._remember(set(sightings))]
        rerouted = sum(self._reroute(requests[rid], "lost its heartbeat")
                       for rid, remedy in findings.now.items() if remedy is Remedy.REROUTE)
        resent = webhooks_resent = 0
        for found in confirmed:
            if isinstance(found, tuple):
                webhooks_resent += self._resend_webhook(*found)
            elif findings.suspects[found] is Remedy.REROUTE:
                rerouted += self._reroute(requests[found], "does not hold it")
            else:
                resent += self._resend(requests[found])
        cleaned = self._forget_stale_assignments(statuses) + self._drop_finished_unacked()
        return Report(rerouted, resent, webhooks_resent, len(sightings) - len(confirmed),
                      cleaned)

    def _unchanged_in_flight(self) -> list[InFlight]:
        # NOTE: `updated_at` and the cutoff by one clock, the database's: a host whose clock is
        # off (the writer's or the sweep's) cannot make work look stranded early, or late.
        cutoff = database_now(self.stranded_after_s)
        r = InferenceRequest
        with self.outbox.db.session() as session:
            rows = session.execute(
                select(r.id, r.status, r.instance_id, r.attempt, r.priority,
                       r.predicted_at.is_not(None))
                .where(r.status.in_([str(s) for s in _IN_FLIGHT]), r.updated_at < cutoff)
                .order_by(r.updated_at).limit(_BATCH)
            ).all()
        return [InFlight(id_, RequestStatus(status), instance_id, attempt,
                         Priority(priority).rank, bool(predicted))
                for id_, status, instance_id, attempt, priority, predicted in rows]

    def _with_message(self, engine_queues: list[str]) -> set[str]:
        """Requests some message concerns, or that the router holds (late binding: the
        release task routes them when an instance has room)."""
        in_broker = request_ids_in_broker(self.broker, [*SERVICE_QUEUES, *engine_queues],
                                          fresh_s=self.unacked_fresh_s)
        held = (self.fleet.held_request_ids(since=time.time() - self.hold_limit_s)
                if self.hold_limit_s > 0 else set())
        return in_broker | self.outbox.pending_request_ids() | held

    def _remember(self, sightings: set[str]) -> set[str]:
        """Store this sweep's sightings; return those the previous sweep made too (a request
        that moved on meanwhile is a new sighting)."""
        raw = self.broker.get(_SUSPECTS_KEY)
        self.broker.set(_SUSPECTS_KEY, json.dumps(sorted(sightings)),
                        ex=max(1, round(self.memory_s)))
        return sightings & set(json.loads(raw) if raw else ())

    def _overdue_events(self, messages: Callable[[], set[str]]) -> list[tuple[str, str]]:
        with self.outbox.db.session() as session:
            overdue = overdue_events(session, self.webhooks, utcnow())
        if not overdue:
            return []
        with_message = messages()
        return [(subject, kind) for subject, kind in overdue if subject not in with_message]

    def _resend_webhook(self, subject_id: str, event_type: str) -> int:
        with self.outbox.transaction() as tx:
            tx.post(dispatch.webhook(subject_id, event_type))
        return 1

    def _forget_stale_assignments(self, statuses: list[InstanceStatus]) -> int:
        """Assignments (noted by routers before their decision commits) whose request is not
        routed to that instance: the router died before its commit, or the request moved on."""
        cutoff = time.time() - self.stranded_after_s
        noted = {(s.instance_id, a.request_id) for s in statuses for a in s.assigned
                 if a.at < cutoff}
        if not noted:
            return 0
        r = InferenceRequest
        with self.outbox.db.session() as session:
            routed = set(session.execute(
                select(r.instance_id, r.id).where(r.id.in_([rid for _, rid in noted]),
                                                  r.status == str(RequestStatus.ROUTED))
            ).tuples().all())
        for instance_id, request_id in noted - routed:
            self.fleet.unassign(instance_id, request_id)
        return len(noted - routed)

    def _drop_finished_unacked(self) -> int:
        """Messages taken by a worker that died (or whose acknowledgement a Redis restart lost)
        about requests and batches finished since, or about none: a periodic task's run, which
        beat sends again anyway."""
        stale = stale_unacked(self.broker, older_than_s=self.unacked_fresh_s)
        if not stale:
            return 0
        ids = set().union(*stale.values())
        finished = _finished(self.outbox.db, ids) if ids else set()
        done = [tag for tag, concerned in stale.items() if concerned <= finished]
        drop_unacked(self.broker, done)
        return len(done)

    def _reroute(self, request: InFlight, why: str) -> int:
        with self.outbox.transaction() as tx:
            moved = request_store.transition(
                tx.session, request.id, RequestStatus.QUEUED, allowed_from=_ON_INSTANCE,
                extra_where=[InferenceRequest.instance_id == request.instance_id,
                             InferenceRequest.attempt == request.attempt],
                detail=f"requeued: instance {request.instance_id} {why}",
            )
            if moved:
                tx.post(dispatch.route(request.id, priority=request.priority_rank))
        if moved and request.instance_id is not None:
            self.fleet.unassign(request.instance_id, request.id)
        return int(moved)

    def _resend(self, request: InFlight) -> int:
        """Touch the request (so the next sweeps wait `stranded_after_s` again) and send its
        stage's message, if it is still where the sweep found it."""
        with self.outbox.transaction() as tx:
            touched = tx.session.execute(
                update(InferenceRequest)
                .where(InferenceRequest.id == request.id,
                       InferenceRequest.status == str(request.status),
                       InferenceRequest.attempt == request.attempt)
                .values(updated_at=database_now())
                .execution_options(synchronize_session=False)
            ).rowcount  # type: ignore[attr-defined]
            if touched:
                tx.post(request.next_message())
        return int(touched)


def _sighting(request: InFlight, remedy: Remedy) -> str:
    return f"{request.id}:{request.status}:{request.instance_id}:{request.attempt}:{remedy}"


def _finished(db: Database, ids: set[str]) -> set[str]:
    """Those of `ids` that name a terminal request or batch."""
    with db.session() as session:
        requests = session.scalars(select(InferenceRequest.id).where(
            InferenceRequest.id.in_(ids),
            InferenceRequest.status.in_([str(s) for s in TERMINAL_STATUSES]))).all()
        batches = session.scalars(select(Batch.id).where(
            Batch.id.in_(ids),
            Batch.status.in_([str(s) for s in TERMINAL_BATCH_STATUSES]))).all()
    return {*requests, *batches}


def _held(state: EngineState | None) -> set[str]:
    return {r.request_id for r in state.requests} if state is not None else set()
