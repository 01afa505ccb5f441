"""The periodic sweep for stranded requests (run by celery beat)."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from sqlalchemy import select, update

from app import dispatch, store
from app.models import InferenceRequest, Priority, RequestStatus, utcnow
from workers import runtime

logger = logging.getLogger(__name__)

_ON_INSTANCE = (RequestStatus.ROUTED, RequestStatus.RUNNING)
_BEFORE_ROUTING = (RequestStatus.QUEUED, RequestStatus.PREDICTING)


@shared_task(name=dispatch.TASK_REQUEUE_ORPHANS)
def requeue_orphans() -> dict[str, int]:
    """Re-route work of dead instances; re-enqueue requests stuck before routing.

    Batch lines the releaser holds back are not requests yet (they wait in `batch_lines`), so
    this sweep never starts them; it only recovers batch requests already released.
    """
    rt = runtime.get()
    dead = [s.instance_id for s in rt.fleet.statuses() if not s.alive]
    rerouted = _reroute_from(dead) if dead else 0
    repredicted = _repredict_stale(rt.settings.stale_queued_after_s)
    if rerouted or repredicted:
        logger.warning("orphan sweep: rerouted %d, re-enqueued %d", rerouted, repredicted)
    return {"rerouted": rerouted, "repredicted": repredicted}


def _reroute_from(dead_instance_ids: list[str]) -> int:
    rt = runtime.get()
    requeued: list[tuple[str, int]] = []
    with rt.db.session() as session:
        rows = session.execute(
            select(InferenceRequest.id, InferenceRequest.instance_id, InferenceRequest.priority)
            .where(InferenceRequest.status.in_([str(s) for s in _ON_INSTANCE]))
            .where(InferenceRequest.instance_id.in_(dead_instance_ids))
        ).all()
        for request_id, instance_id, priority in rows:
            if store.transition(
                session,
                request_id,
                RequestStatus.QUEUED,
                allowed_from=_ON_INSTANCE,
                extra_where=[InferenceRequest.instance_id == instance_id],
                detail=f"requeued: instance {instance_id} lost its heartbeat",
            ):
                requeued.append((request_id, Priority(priority).rank))
    for request_id, rank in requeued:
        dispatch.enqueue_route(runtime.current_celery(), request_id, priority=rank)
    return len(requeued)


def _repredict_stale(after_s: float) -> int:
    rt = runtime.get()
    cutoff = utcnow() - timedelta(seconds=after_s)
    with rt.db.session() as session:
        rows = session.execute(
            select(InferenceRequest.id, InferenceRequest.priority)
            .where(InferenceRequest.status.in_([str(s) for s in _BEFORE_ROUTING]))
            .where(InferenceRequest.updated_at < cutoff)
            .limit(1000)
        ).all()
        # Touch them so the next sweep waits another `after_s` before re-enqueueing again.
        session.execute(
            update(InferenceRequest)
            .where(InferenceRequest.id.in_([request_id for request_id, _ in rows]))
            .values(updated_at=utcnow())
        )
    for request_id, priority in rows:
        dispatch.enqueue_predict(
            runtime.current_celery(), request_id, priority=Priority(priority).rank
        )
    return len(rows)
