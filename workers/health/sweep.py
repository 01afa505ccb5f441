"""The sweep for stranded requests: work of instances that lost their heartbeat goes back to
routing, requests stuck before routing go back to prediction. Each function commits the status
changes it makes and returns the requests to enqueue (id, priority rank)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update

from app import store
from app.db import Database
from app.fleet import Fleet
from app.models import InferenceRequest, Priority, RequestStatus, utcnow

__all__ = ["dead_instances", "requeue_from", "touch_stale"]

_ON_INSTANCE = (RequestStatus.ROUTED, RequestStatus.RUNNING)
_BEFORE_ROUTING = (RequestStatus.QUEUED, RequestStatus.PREDICTING)


def dead_instances(fleet: Fleet) -> list[str]:
    return [s.instance_id for s in fleet.statuses() if not s.alive]


def requeue_from(db: Database, dead_instance_ids: list[str]) -> list[tuple[str, int]]:
    """Requests routed to or running on the dead instances, set back to queued."""
    requeued: list[tuple[str, int]] = []
    with db.session() as session:
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
    return requeued


def touch_stale(db: Database, after_s: float) -> list[tuple[str, int]]:
    """Requests queued or predicting for longer than `after_s` (up to 1,000), touched so that
    the next sweep waits another `after_s` before picking them again."""
    cutoff = utcnow() - timedelta(seconds=after_s)
    with db.session() as session:
        rows = session.execute(
            select(InferenceRequest.id, InferenceRequest.priority)
            .where(InferenceRequest.status.in_([str(s) for s in _BEFORE_ROUTING]))
            .where(InferenceRequest.updated_at < cutoff)
            .limit(1000)
        ).all()
        session.execute(
            update(InferenceRequest)
            .where(InferenceRequest.id.in_([request_id for request_id, _ in rows]))
            .values(updated_at=utcnow())
        )
    return [(request_id, Priority(priority).rank) for request_id, priority in rows]
