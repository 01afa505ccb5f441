"""Celery task of the route stage."""

from __future__ import annotations

import logging
import random
import time

from celery import Celery, shared_task
from sqlalchemy import select

from app import dispatch, metrics, store
from app.bias import FALLBACK_POLICY
from app.models import InferenceRequest, Priority, RequestStatus, utcnow
from workers import runtime
from workers.route.planner import plan_route
from workers.route.policies import POLICIES, RequestView, RoutingContext, needs_what_if

logger = logging.getLogger(__name__)
_rng = random.Random()


@shared_task(name=dispatch.TASK_ROUTE)
def route(request_id: str, timing: dict[str, float] | None = None) -> None:
    """Pick an alive instance, record the decision, then publish to its queue. Safe to rerun.

    `timing` (Unix times the predict stage took and finished the request) lets the decision
    record the whole overhead from entering predict to the publish on gpu.<k>, by stage.
    """
    route_started_at = time.time()
    rt = runtime.get()
    celery = runtime.current_celery()
    with rt.db.session() as session:
        request = session.get(InferenceRequest, request_id)
        if request is None:
            return
        if request.status == RequestStatus.ROUTED:
            # A redelivery after the decision committed: make sure the engine got it.
            _publish(request, celery)
            return
        if request.status not in (RequestStatus.QUEUED, RequestStatus.PREDICTING):
            return
        view = RequestView(
            request_id=request.id,
            num_prompt_tokens=request.prompt_tokens,
            predicted_output_tokens=request.predicted_output_tokens,
            max_tokens=request.max_tokens,
        )
        priority = Priority(request.priority).rank
    started = time.perf_counter()
    candidates = rt.fleet.routable()
    if not candidates:
        dispatch.enqueue_route(
            celery, request_id, priority=priority, countdown=rt.settings.route_retry_s
        )
        return
    fallback = rt.bias_watch.fallback()
    policy = FALLBACK_POLICY if fallback else _policy_in_force(rt)
    plan = plan_route(
        policy,
        view,
        candidates,
        RoutingContext(ticket=rt.fleet.next_round_robin(), rng=_rng),
        rt.exec_models(c.instance_id for c in candidates) if needs_what_if(policy) else None,
    )
    decision = plan.decision
    chosen_what_if = plan.what_ifs.get(decision.instance_id, (None, None))
    decision_ms = (time.perf_counter() - started) * 1000
    rt.fleet.assign(
        decision.instance_id,
        request_id,
        num_prompt_tokens=view.num_prompt_tokens,
        predicted_output_tokens=view.predicted_output_tokens,
    )
    routing = {
        "scores": decision.scores,
        "what_ifs": plan.what_ifs,
        "decision_ms": round(decision_ms, 3),
    }
    if fallback:
        routing["fallback"] = fallback
    routing.update(_overhead(timing or {}, route_started_at))
    with rt.db.session() as session:
        routed = store.transition(
            session,
            request_id,
            RequestStatus.ROUTED,
            allowed_from={RequestStatus.QUEUED, RequestStatus.PREDICTING},
            detail=f"{decision.policy}{' (fallback)' if fallback else ''} -> "
            f"{decision.instance_id}",
            instance_id=decision.instance_id,
            policy=decision.policy,
            routing=routing,
            predicted_ttft_s=chosen_what_if[0],
            predicted_e2e_s=chosen_what_if[1],
            routed_at=utcnow(),
            attempt=InferenceRequest.attempt + 1,
        )
        attempt = session.scalar(
            select(InferenceRequest.attempt).where(InferenceRequest.id == request_id)
        )
    if not routed or attempt is None:
        rt.fleet.unassign(decision.instance_id, request_id)
        return
    metrics.observe_routing(decision.policy, decision.instance_id, routing)
    logger.info("routed to %s by %s", decision.instance_id, decision.policy,
                extra={"instance_id": decision.instance_id, "policy": decision.policy,
                       "fallback": bool(fallback), "decision_ms": routing["decision_ms"]})
    dispatch.enqueue_generate(
        celery, request_id, instance_id=decision.instance_id, attempt=attempt, priority=priority
    )


def _policy_in_force(rt: runtime.Runtime) -> str:
    """The operator's run-time override (admin API), else the configured policy."""
    override = rt.fleet.policy_override()
    if override is None:
        return rt.settings.routing_policy
    if override not in POLICIES.names():
        logger.error("ignoring unknown routing policy override %r", override)
        return rt.settings.routing_policy
    return override


def _overhead(timing: dict[str, float], route_started_at: float) -> dict[str, object]:
    """Overhead from entering predict to now (the publish follows the decision's commit at
    once), with its stages: predict, the hand-off through the broker, and the route task."""
    started, predicted = timing.get("predict_started_at"), timing.get("predicted_at")
    if started is None or predicted is None:
        return {}
    now = time.time()
    return {
        "overhead_ms": round((now - started) * 1000, 3),
        "stages_ms": {
            "predict": round((predicted - started) * 1000, 3),
            "handoff": round((route_started_at - predicted) * 1000, 3),
            "route": round((now - route_started_at) * 1000, 3),
        },
    }


def _publish(request: InferenceRequest, celery: Celery) -> None:
    assert request.instance_id is not None
    dispatch.enqueue_generate(
        celery,
        request.id,
        instance_id=request.instance_id,
        attempt=request.attempt,
        priority=Priority(request.priority).rank,
    )
