"""Routing one stored request in production: read the fleet, run the decision pipeline
(`workers.route.pipeline`), record the outcome.

The route task, the predict task (routing the request it has just predicted) and the API
(routing the held completions it accepts) all come here; none of them decides anything itself.
No Celery here: the API imports this module, never a task module.
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
from collections.abc import Collection, Sequence
from typing import Any

import redis
from sqlalchemy import update

from domain import dispatch, metrics
from domain.models import InferenceRequest, Priority, RequestStatus
from domain.streams import close_stream
from workers import runtime
from workers.route import pipeline, stage
from workers.route.late_binding import Held, must_wait
from workers.route.pipeline import Routed, Unrouted

__all__ = ["ROUTABLE", "Routing", "route_request"]

logger = logging.getLogger(__name__)
_rng = random.Random()

#: Statuses a request is routed from by the route task (the predict task routes from predicting).
ROUTABLE = frozenset({RequestStatus.QUEUED, RequestStatus.PREDICTING})
# NOTE: one decision at a time per process, from reading the fleet to noting the assignment, so
# that each decision sees the one before it (the what-ifs count assigned requests).
_deciding = threading.Lock()


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
    rules = stage.routing_rules(rt.settings)
    if rules.late_binding is not None and held_since is None and _behind_held(
            rt, request, rules.late_binding.overtake_s):
        _hold(rt, request_id, time.time(), allowed_from, columns)
        return Routing.HELD
    outcome, decision_ms = _decide(rt, request, rules, held_since)
    if outcome is Unrouted.NO_INSTANCE:
        return Routing.NO_INSTANCE
    if outcome is Unrouted.HELD:
        _hold(rt, request_id, held_since or time.time(), allowed_from, columns)
        return Routing.HELD
    assert isinstance(outcome, Routed)
    routing = stage.routing_record(outcome, decision_ms, timing, route_started_at, held_since)
    if outcome.refused:
        _refuse(rt, request_id, outcome, routing, allowed_from, columns or {}, retire)
        return Routing.DONE
    _commit(rt, request, outcome, routing, allowed_from, columns, retire)
    return Routing.DONE


def _decide(rt: runtime.Runtime, request: stage.RouteInput, rules: pipeline.RoutingRules,
            held_since: float | None) -> tuple[Routed | Unrouted, float]:
    """The pipeline's outcome on the fleet as it is now, and the decision's time in ms; the
    assignment is noted unless the request is refused, held or has nowhere to go."""
    sessions_on = request.session_key is not None and rt.settings.session_affinity_ttl_s > 0
    # NOTE: read before the decision's lock: one Redis round trip, only for a session.
    preferred = (stage.last_instance(rt.redis, request.session_key)  # type: ignore[arg-type]
                 if sessions_on else None)
    with _deciding:
        started = time.perf_counter()
        statuses, override = rt.fleet.routing_view()
        now = time.time()
        outcome = pipeline.decide_route(
            stage.route_request_of(request, session=sessions_on, preferred=preferred,
                                   held_since=held_since),
            pipeline.FleetRead(statuses, override, rt.bias_watch.fallback()),
            rules,
            pipeline.DecisionContext(now=now, rng=_rng, next_ticket=rt.fleet.next_round_robin,
                                     exec_models=stage.exec_models(rt).for_candidates))
        decision_ms = (time.perf_counter() - started) * 1000
        if isinstance(outcome, Routed) and not outcome.refused:
            rt.fleet.assign(
                outcome.instance_id,
                request.view.request_id,
                num_prompt_tokens=request.view.num_prompt_tokens,
                predicted_output_tokens=request.view.predicted_output_tokens,
                priority_class=request.view.priority_class,
            )
    return outcome, decision_ms


def _commit(rt: runtime.Runtime, request: stage.RouteInput, outcome: Routed,
            routing: dict[str, Any], allowed_from: Collection[RequestStatus],
            columns: dict[str, Any] | None, retire: Sequence[int]) -> None:
    """Record the decision and post the request to its instance's queue, in one transaction."""
    request_id = request.view.request_id
    decision = outcome.plan.decision
    priority = Priority.BATCH.rank if outcome.demoted else request.priority
    with rt.outbox.transaction() as tx:
        tx.retire(retire)
        attempt = stage.record(tx.session, request_id, outcome.plan, routing,
                               fallback=bool(outcome.fallback), allowed_from=allowed_from,
                               note=" (latency targets unmeetable: run as batch)"
                               if outcome.demoted else "",
                               **({"priority": Priority.BATCH} if outcome.demoted else {}),
                               **(columns or {}))
        if attempt is not None:
            tx.post(dispatch.generate(request_id, instance_id=decision.instance_id,
                                      attempt=attempt, priority=priority))
    if attempt is None:
        rt.fleet.unassign(decision.instance_id, request_id)
        return
    metrics.observe_routing(decision.policy, decision.instance_id, routing)
    affinity = outcome.affinity
    if affinity is not None:
        assert request.session_key is not None
        stage.remember_instance(rt.redis, request.session_key, decision.instance_id,
                                rt.settings.session_affinity_ttl_s)
        metrics.observe_affinity(str(affinity.outcome))
    # NOTE: at info: the one line that ties a request to its instance in every stage's logs.
    logger.info("routed to %s by %s", decision.instance_id, decision.policy,
                extra={"instance_id": decision.instance_id, "policy": decision.policy,
                       "fallback": bool(outcome.fallback),
                       "decision_ms": routing["decision_ms"],
                       **({"affinity": str(affinity.outcome)} if affinity else {})})


def _behind_held(rt: runtime.Runtime, request: stage.RouteInput, overtake_s: float) -> bool:
    """Whether a new request must wait behind those held (`late_binding.must_wait`)."""
    now = time.time()
    overdue = [(held_id, since) for held_id, since in rt.fleet.held(stage.RELEASE_SCAN)
               if since <= now - overtake_s and held_id != request.view.request_id]
    if not overdue:
        return False
    models = stage.models_by_id(rt.db, [held_id for held_id, _ in overdue])
    return must_wait(request.model,
                     [Held(held_id, since, models.get(held_id)) for held_id, since in overdue],
                     now, overtake_s)


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


def _refuse(rt: runtime.Runtime, request_id: str, outcome: Routed, routing: dict[str, Any],
            allowed_from: Collection[RequestStatus], columns: dict[str, Any],
            retire: Sequence[int]) -> None:
    """End the request rejected (its latency targets are out of reach and its team refuses
    such requests), then wake whoever waits for its end (a held OpenAI call answers 429)."""
    miss = outcome.miss
    assert miss is not None
    with rt.outbox.transaction() as tx:
        tx.retire(retire)
        refused = stage.reject(tx.session, request_id, outcome.plan, routing, miss,
                               allowed_from=allowed_from, **columns)
        if refused is not None and refused.webhook_url:
            tx.post(dispatch.webhook(request_id, "request.rejected"))
    if refused is None:
        return  # cancelled meanwhile
    logger.info("refused: latency targets unmeetable (x%.2f)", miss.shortfall,
                extra={"policy": outcome.plan.decision.policy, "instance_id": miss.instance_id})
    try:
        close_stream(rt.redis, request_id, refused.attempt, refused.message)
    except redis.RedisError:
        pass  # NOTE: its waiters find the row when they next poll it
