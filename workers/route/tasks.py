"""Celery task of the route stage."""

from __future__ import annotations

import random
import time

from celery import shared_task

from app import dispatch, store
from app.fleet import InstanceStatus
from app.models import InferenceRequest, Priority, RequestStatus, utcnow
from workers import runtime
from workers.route.policies import InstanceView, RequestView, RoutingContext, decide

_rng = random.Random()


@shared_task(name=dispatch.TASK_ROUTE)
def route(request_id: str) -> None:
    """Pick an alive instance, record the decision, then publish to its queue. Safe to rerun."""
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
    candidates = [_instance_view(status) for status in rt.fleet.routable()]
    if not candidates:
        dispatch.enqueue_route(
            celery, request_id, priority=priority, countdown=rt.settings.route_retry_s
        )
        return
    ctx = RoutingContext(ticket=rt.fleet.next_round_robin(), rng=_rng)
    decision = decide(rt.settings.routing_policy, view, candidates, ctx)
    decision_ms = (time.perf_counter() - started) * 1000
    rt.fleet.assign(decision.instance_id, request_id)
    with rt.db.session() as session:
        routed = store.transition(
            session,
            request_id,
            RequestStatus.ROUTED,
            allowed_from={RequestStatus.QUEUED, RequestStatus.PREDICTING},
            detail=f"{decision.policy} -> {decision.instance_id}",
            instance_id=decision.instance_id,
            policy=decision.policy,
            routing={"scores": decision.scores, "decision_ms": round(decision_ms, 3)},
            routed_at=utcnow(),
            attempt=InferenceRequest.attempt + 1,
        )
        request = session.get(InferenceRequest, request_id)
        if routed and request is not None:
            session.refresh(request)
    if routed and request is not None:
        _publish(request, celery)


def _publish(request: InferenceRequest, celery) -> None:  # type: ignore[no-untyped-def]
    assert request.instance_id is not None
    dispatch.enqueue_generate(
        celery,
        request.id,
        instance_id=request.instance_id,
        attempt=request.attempt,
        priority=Priority(request.priority).rank,
    )


def _instance_view(status: InstanceStatus) -> InstanceView:
    return InstanceView(
        instance_id=status.instance_id,
        num_running=status.num_running,
        num_waiting=status.num_waiting,
        num_assigned=status.num_assigned,
        num_free_blocks=int(status.state.get("num_free_blocks", 0)),
        num_total_blocks=int(status.state.get("num_total_blocks", 0)),
    )
