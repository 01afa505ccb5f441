"""Celery task of the route stage (logic in `workers/route/stage.py` and `planner.py`)."""

from __future__ import annotations

import dataclasses
import enum
import logging
import random
import threading
import time
from collections.abc import Collection, Sequence
from typing import Any

import redis
from celery import shared_task
from sqlalchemy import update

from app import dispatch, metrics
from app.bias import FALLBACK_POLICY
from app.models import InferenceRequest, Priority, RequestStatus, utcnow
from app.settings import Settings
from app.slo import SloMissAction
from app.streams import close_stream
from workers import runtime
from workers.locks import held as held_lock
from workers.retries import ON_OUTAGE
from workers.route import affinity as session_affinity
from workers.route import stage, targets
from workers.route.late_binding import LateBinding
from workers.route.planner import Plan, plan_route
from workers.route.policies import RoutingContext, needs_what_if

logger = logging.getLogger(__name__)
_rng = random.Random()


#: The policy that reads RoutingContext.ticket.
ROUND_ROBIN = "round_robin"
#: Statuses a request is routed from by the route task (the predict task routes from predicting).
ROUTABLE = frozenset({RequestStatus.QUEUED, RequestStatus.PREDICTING})
#: Late binding: held requests one release looks at, oldest first.
RELEASE_SCAN = 16
RELEASE_LOCK = "blockq:route:release"
#: Longer than a release of RELEASE_SCAN requests takes; a dead releaser's lock expires.
RELEASE_LOCK_TTL_S = 10.0
# NOTE: one decision at a time per process, from reading the fleet to noting the assignment, so
# that each decision sees the one before it (the what-ifs count assigned requests).
_deciding = threading.Lock()


@shared_task(name=dispatch.TASK_ROUTE, **ON_OUTAGE)
def route(request_id: str, timing: dict[str, float] | None = None) -> None:
    """Pick an alive instance, record the decision, then publish to its queue. Safe to rerun.

    `timing` (Unix times the predict stage took and finished the request) lets the decision
    record the whole overhead from entering predict to the publish on gpu.<k>, by stage.
    """
    route_started_at = time.time()
    rt = runtime.get()
    celery = runtime.current_celery()
    request = stage.load(rt.db, request_id)
    if request is None:
        return
    if request.status == RequestStatus.ROUTED:
        # A redelivery after the decision committed: make sure the engine got it.
        assert request.instance_id is not None
        dispatch.generate(request_id, instance_id=request.instance_id, attempt=request.attempt,
                          priority=request.priority).send(celery)
        return
    if request.status not in ROUTABLE:
        return
    outcome = route_request(rt, request, timing or {}, route_started_at)
    if not outcome:
        # NOTE: a plain send: if it is lost, the stranded-request sweep finds the request.
        dispatch.route(request_id, priority=request.priority).send(
            celery, countdown=rt.settings.route_retry_s)
    elif outcome is Routing.DONE:
        # NOTE: a held request the sweep sent here (held past the sweep's limit, or late
        # binding turned off meanwhile) is routed now: it leaves the hold.
        rt.fleet.unhold(request_id)


@shared_task(name=dispatch.TASK_RELEASE_HELD, **ON_OUTAGE)
def release_held() -> None:
    """Route held requests that an instance would now start (late binding), oldest first.

    Sent by an engine that has just published room while requests are held; one release at
    a time (a Redis lock: a second one sent meanwhile does nothing). Later requests of its
    model pass a held one only until it has been held `routing_hold_overtake_s` (another
    model's requests run on other instances: they never wait behind it).
    """
    rt = runtime.get()
    settings = rt.settings
    with held_lock(rt.redis, RELEASE_LOCK, ttl_s=RELEASE_LOCK_TTL_S) as got:
        if not got:
            return
        blocked: set[str | None] = set()  # models whose oldest held request must go first
        for request_id, since in rt.fleet.held(RELEASE_SCAN):
            request = stage.load(rt.db, request_id)
            if request is None or request.status not in ROUTABLE:
                rt.fleet.unhold(request_id)  # routed, cancelled or gone meanwhile
                continue
            if request.model in blocked or None in blocked:
                continue
            outcome = route_request(rt, request, {}, time.time(), held_since=since)
            if outcome is Routing.DONE:
                rt.fleet.unhold(request_id)
            elif time.time() - since >= settings.routing_hold_overtake_s:
                # Strict arrival order within its model: nothing of its model passes it (a
                # request of no recorded model may run anywhere: nothing passes it).
                blocked.add(request.model)


class Routing(enum.Enum):
    """What `route_request` did; falsy only for NO_INSTANCE."""

    DONE = "done"  # routed or refused (or left alone: it left `allowed_from` meanwhile)
    HELD = "held"  # held at the router (late binding): the release task routes it later
    NO_INSTANCE = "no_instance"  # no instance is routable: nothing was written

    def __bool__(self) -> bool:
        return self is not Routing.NO_INSTANCE


def route_request(rt: runtime.Runtime, request: stage.RouteInput, timing: dict[str, float],
                  route_started_at: float, *,
                  allowed_from: Collection[RequestStatus] = ROUTABLE,
                  columns: dict[str, Any] | None = None,
                  held_since: float | None = None,
                  retire: Sequence[int] = ()) -> Routing:
    """Decide, record the decision in one transaction (with `columns`: the predict task routes
    the request it has just predicted and writes its prediction in the same UPDATE), and
    publish to the chosen instance's queue through the outbox.

    With `routing_hold` (late binding) a request no instance would start soon is held instead
    (its `columns` written, nothing published; `held_since`: it is being released, held since
    then). NO_INSTANCE when no instance is routable: nothing was written. `retire`: deferred
    outbox entries that the transaction recording the decision deletes (the API routing a
    request itself retires its predict message).
    """
    request_id = request.view.request_id
    hold = _late_binding(rt.settings, held_since)
    if hold is not None and held_since is None and _behind_held(rt, request):
        _hold(rt, request_id, time.time(), allowed_from, columns)
        return Routing.HELD
    decided = _decide(rt, request, hold)
    if decided is None:
        return Routing.NO_INSTANCE
    if decided is Routing.HELD:
        _hold(rt, request_id, held_since or time.time(), allowed_from, columns)
        return Routing.HELD
    plan, miss, affinity, fallback, decision_ms = decided
    decision = plan.decision
    routing = stage.routing_record(plan, decision_ms, fallback, timing, route_started_at)
    if request.targets is not None:
        routing["slo"] = miss.record() if miss is not None else {
            "met": plan.decision.meets_target}
    if affinity is not None:
        routing["affinity"] = affinity.record()
    if held_since is not None:
        routing["held_s"] = round(time.time() - held_since, 3)
    if miss is not None and miss.action is SloMissAction.REFUSE:
        _refuse(rt, request_id, plan, routing, miss, allowed_from, columns or {}, retire)
        return Routing.DONE
    demoted = miss is not None and miss.action is SloMissAction.QUEUE
    priority = Priority.BATCH.rank if demoted else request.priority
    with rt.outbox.transaction() as tx:
        tx.retire(retire)
        attempt = stage.record(tx.session, request_id, plan, routing, fallback=bool(fallback),
                               allowed_from=allowed_from,
                               note=" (latency targets unmeetable: run as batch)" if demoted
                               else "",
                               **({"priority": Priority.BATCH} if demoted else {}),
                               **(columns or {}))
        if attempt is not None:
            tx.post(dispatch.generate(request_id, instance_id=decision.instance_id,
                                      attempt=attempt, priority=priority))
    if attempt is None:
        rt.fleet.unassign(decision.instance_id, request_id)
        return Routing.DONE
    metrics.observe_routing(decision.policy, decision.instance_id, routing)
    if affinity is not None:
        assert request.session_key is not None
        stage.remember_instance(rt.redis, request.session_key, decision.instance_id,
                                rt.settings.session_affinity_ttl_s)
        metrics.observe_affinity(str(affinity.outcome))
    logger.info("routed to %s by %s", decision.instance_id, decision.policy,
                extra={"instance_id": decision.instance_id, "policy": decision.policy,
                       "fallback": bool(fallback), "decision_ms": routing["decision_ms"],
                       **({"affinity": str(affinity.outcome)} if affinity else {})})
    return Routing.DONE


def _late_binding(settings: Settings, held_since: float | None) -> LateBinding | None:
    """The hold rule in force, or None: late binding off, or the request held too long."""
    if not settings.routing_hold or (
            held_since is not None and time.time() - held_since >= settings.routing_hold_max_s):
        return None
    return LateBinding(max_queueing_s=settings.routing_hold_max_queueing_s,
                       overtake_s=settings.routing_hold_overtake_s)


def _behind_held(rt: runtime.Runtime, request: stage.RouteInput) -> bool:
    """Whether a new request must wait behind those held: one of its model has been held past
    `routing_hold_overtake_s` (strict arrival order from then on, within each model)."""
    cutoff = time.time() - rt.settings.routing_hold_overtake_s
    overdue = [held_id for held_id, since in rt.fleet.held(RELEASE_SCAN)
               if since <= cutoff and held_id != request.view.request_id]
    if not overdue:
        return False
    if request.model is None:
        return True  # it may run anywhere: behind every model's
    return bool(stage.models_of(rt.db, overdue) & {request.model, None})


def _hold(rt: runtime.Runtime, request_id: str, since: float,
          allowed_from: Collection[RequestStatus], columns: dict[str, Any] | None) -> None:
    """Hold the request at the router (its prediction, if given, written first).

    NOTE: a request whose hold is lost (Redis restarted empty, or this process died between
    the write and the hold) has no message anywhere: the stranded-request sweep sends it to
    the route task again, which holds it again.
    """
    if columns:
        with rt.db.session() as session:
            session.execute(
                update(InferenceRequest)
                .where(InferenceRequest.id == request_id,
                       InferenceRequest.status.in_([str(s) for s in allowed_from]))
                .values(**columns).execution_options(synchronize_session=False))
    rt.fleet.hold_request(request_id, since)
    metrics.observe_held()


def _decide(rt: runtime.Runtime, request: stage.RouteInput, hold: LateBinding | None = None
            ) -> tuple[Plan, targets.Miss | None, session_affinity.Affinity | None,
                       dict[str, Any] | None, float] | Routing | None:
    """The plan (on the instance closest to the targets when none meets them: `decide`; on
    the session's previous instance while it has room: `affinity.prefer`), the miss if any,
    the session's affinity if it has a session, the bias watch's fallback and the decision's
    time in ms; the assignment is noted unless the request is to be refused or held. None
    when no instance is routable; Routing.HELD when `hold` holds it (no instance would start
    it soon)."""
    sessions_on = request.session_key is not None and rt.settings.session_affinity_ttl_s > 0
    # NOTE: read before the decision's lock: one Redis round trip, only for a session.
    preferred = (stage.last_instance(rt.redis, request.session_key)  # type: ignore[arg-type]
                 if sessions_on else None)
    affinity = None
    with _deciding:
        started = time.perf_counter()
        # NOTE: only the instances of the request's model (a row from before models were
        # recorded: any); none up: it waits (route retry) until one returns.
        candidates, override = rt.fleet.routing_view(request.model)
        if not candidates:
            return None
        fallback = rt.bias_watch.fallback()
        policy = (FALLBACK_POLICY if fallback
                  else stage.policy_in_force(override, rt.settings, candidates))
        exec_models = (stage.exec_models(rt).of(
            (c.instance_id for c in candidates),
            {c.instance_id: c.state.exec_model for c in candidates if c.state is not None})
            if needs_what_if(policy) else None)
        view = targets.budgeted(request.view, request.targets, utcnow())
        # NOTE: only round robin reads the fleet-wide ticket: no Redis INCR for the others.
        ticket = rt.fleet.next_round_robin() if policy == ROUND_ROBIN else 0
        plan = plan_route(policy, view, candidates, RoutingContext(ticket=ticket, rng=_rng),
                          exec_models, late_binding=hold)
        if plan.startable is not None and not plan.startable:
            return Routing.HELD
        miss = targets.on_miss(plan, view, request.targets, first_routing=request.attempt == 0,
                               refuse_margin=rt.settings.slo_refuse_margin)
        refused = miss is not None and miss.action is SloMissAction.REFUSE
        if sessions_on and not refused:
            affinity = session_affinity.prefer(plan.decision, plan.what_ifs, view, preferred,
                                               margin=rt.settings.session_affinity_margin)
            if affinity.instance_id != plan.decision.instance_id:
                plan = dataclasses.replace(plan, decision=dataclasses.replace(
                    plan.decision, instance_id=affinity.instance_id))
        decision_ms = (time.perf_counter() - started) * 1000
        if not refused:
            rt.fleet.assign(
                plan.decision.instance_id,
                request.view.request_id,
                num_prompt_tokens=request.view.num_prompt_tokens,
                predicted_output_tokens=request.view.predicted_output_tokens,
                priority_class=request.view.priority_class,
            )
    return plan, miss, affinity, fallback, decision_ms


def _refuse(rt: runtime.Runtime, request_id: str, plan: Plan, routing: dict[str, Any],
            miss: targets.Miss, allowed_from: Collection[RequestStatus],
            columns: dict[str, Any], retire: Sequence[int]) -> None:
    """End the request rejected (its latency targets are out of reach and its team refuses
    such requests), then wake whoever waits for its end (a held OpenAI call answers 429)."""
    with rt.outbox.transaction() as tx:
        tx.retire(retire)
        refused = stage.reject(tx.session, request_id, plan, routing, miss,
                               allowed_from=allowed_from, **columns)
        if refused is not None and refused.webhook_url:
            tx.post(dispatch.webhook(request_id, "request.rejected"))
    if refused is None:
        return  # cancelled meanwhile
    logger.info("refused: latency targets unmeetable (x%.2f)", miss.shortfall,
                extra={"policy": plan.decision.policy, "instance_id": miss.instance_id})
    try:
        close_stream(rt.redis, request_id, refused.attempt, refused.message)
    except redis.RedisError:
        pass  # NOTE: its waiters find the row when they next poll it
