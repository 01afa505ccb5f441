"""Celery tasks of the route stage: the decision itself is `workers/route/pipeline.py`, run and
recorded by `workers/route/routing.py`."""

from __future__ import annotations

import time

from celery import shared_task

from domain import dispatch
from domain.models import RequestStatus
from workers import runtime
from workers.locks import held as held_lock
from workers.retries import ON_OUTAGE
from workers.route import stage
from workers.route.late_binding import Held, release
from workers.route.routing import ROUTABLE, Routing, route_request

__all__ = ["ROUTABLE", "release_held", "route"]

RELEASE_LOCK = "blockq:route:release"
#: Longer than a release of RELEASE_SCAN requests takes; a dead releaser's lock expires.
RELEASE_LOCK_TTL_S = 10.0


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
    """Route held requests that an instance would now start (late binding), oldest first, in
    the order `late_binding.release` gives (the same as the cluster simulation's).

    Sent by an engine that has just published room while requests are held; one release at
    a time (a Redis lock: a second one sent meanwhile does nothing).
    """
    rt = runtime.get()
    with held_lock(rt.redis, RELEASE_LOCK, ttl_s=RELEASE_LOCK_TTL_S) as got:
        if not got:
            return
        entries: list[tuple[Held, stage.RouteInput]] = []
        for request_id, since in rt.fleet.held(stage.RELEASE_SCAN):
            request = stage.load(rt.db, request_id)
            if request is None or request.status not in ROUTABLE:
                rt.fleet.unhold(request_id)  # routed, cancelled or gone meanwhile
                continue
            entries.append((Held(request_id, since, request.model), request))
        inputs = {held.request_id: request for held, request in entries}

        def try_route(held: Held) -> bool:
            outcome = route_request(rt, inputs[held.request_id], {}, time.time(),
                                    held_since=held.since)
            if outcome is Routing.DONE:
                rt.fleet.unhold(held.request_id)
            return outcome is Routing.DONE

        release([held for held, _ in entries], time.time(),
                rt.settings.routing_hold_overtake_s, try_route)
