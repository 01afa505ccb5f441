"""Celery task of the route stage."""

from __future__ import annotations

import random
import time

from celery import Celery, shared_task

from app import dispatch, store
from app.models import InferenceRequest, Priority, RequestStatus, utcnow
from workers import runtime
from workers.route.planner import plan_route
from workers.route.policies import RequestView, RoutingContext, needs_what_if

_rng = random.Random()


@shared_task(name=dispatch.TASK_ROUTE)
def route(request_id: str, predict_started_at: float | None = None) -> None:
    """Pick an alive instance, record the decision, then publish to its queue. Safe to rerun.

    `predict_started_at` (Unix time the predict stage took the request) lets the decision record
    the whole overhead from entering predict to the publish on gpu.<k>.
    """
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
    policy = rt.settings.routing_policy
    plan = plan_route(
        policy,
        view,
        candidates,
        RoutingContext(ticket=rt.fleet.next_round_robin(), rng=_rng),
        rt.routing_exec_model if needs_what_if(policy) else None,
    )
    decision = plan.decision
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
    if predict_started_at is not None:
        # NOTE: measured as the decision is written; the publish follows its commit at once.
        routing["overhead_ms"] = round((time.time() - predict_started_at) * 1000, 3)
    with rt.db.session() as session:
        routed = store.transition(
            session,
            request_id,
            RequestStatus.ROUTED,
            allowed_from={RequestStatus.QUEUED, RequestStatus.PREDICTING},
            detail=f"{decision.policy} -> {decision.instance_id}",
            instance_id=decision.instance_id,
            policy=decision.policy,
            routing=routing,
            routed_at=utcnow(),
            attempt=InferenceRequest.attempt + 1,
        )
        request = session.get(InferenceRequest, request_id)
        if routed and request is not None:
            session.refresh(request)
    if not routed or request is None:
        rt.fleet.unassign(decision.instance_id, request_id)
        return
    _publish(request, celery)


def _publish(request: InferenceRequest, celery: Celery) -> None:
    assert request.instance_id is not None
    dispatch.enqueue_generate(
        celery,
        request.id,
        instance_id=request.instance_id,
        attempt=request.attempt,
        priority=Priority(request.priority).rank,
    )
