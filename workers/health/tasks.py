"""The periodic sweep for stranded requests (run by celery beat; logic in `sweep.py`)."""

from __future__ import annotations

import logging

from celery import shared_task

from app import dispatch
from workers import runtime
from workers.health import sweep

logger = logging.getLogger(__name__)


@shared_task(name=dispatch.TASK_REQUEUE_ORPHANS)
def requeue_orphans() -> dict[str, int]:
    """Re-route work of dead instances; re-enqueue requests stuck before routing.

    Batch lines the releaser holds back are not requests yet (they wait in `batch_lines`), so
    this sweep never starts them; it only recovers batch requests already released.
    """
    rt = runtime.get()
    celery = runtime.current_celery()
    dead = sweep.dead_instances(rt.fleet)
    rerouted = sweep.requeue_from(rt.db, dead) if dead else []
    for request_id, rank in rerouted:
        dispatch.enqueue_route(celery, request_id, priority=rank)
    repredicted = sweep.touch_stale(rt.db, rt.settings.stale_queued_after_s)
    for request_id, rank in repredicted:
        dispatch.enqueue_predict(celery, request_id, priority=rank)
    if rerouted or repredicted:
        logger.warning("orphan sweep: rerouted %d, re-enqueued %d", len(rerouted),
                       len(repredicted))
    return {"rerouted": len(rerouted), "repredicted": len(repredicted)}
