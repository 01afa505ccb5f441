"""Celery tasks of the batches queue: thin adapters over expand, release, expiry and finalize."""

from __future__ import annotations

import logging

from celery import shared_task

from app import dispatch
from app.batches import EVENT_TYPES
from app.models import BatchStatus, Priority
from workers import runtime
from workers.batch.expand import Expansion, expand
from workers.batch.expiry import expire_due
from workers.batch.finalize import finalize
from workers.batch.release import release

logger = logging.getLogger(__name__)


@shared_task(name=dispatch.TASK_BATCH_EXPAND)
def expand_batch(batch_id: str) -> str:
    """Read the input file into lines; a batch stopped meanwhile goes on to finalization."""
    outcome = expand(runtime.get(), batch_id)
    celery = runtime.current_celery()
    if outcome is Expansion.STOPPED:
        dispatch.enqueue_batch_task(celery, dispatch.TASK_BATCH_FINALIZE, batch_id)
    elif outcome is Expansion.FAILED:
        dispatch.enqueue_webhook(celery, batch_id, EVENT_TYPES[BatchStatus.FAILED])
    return outcome.value


@shared_task(name=dispatch.TASK_BATCH_RELEASE)
def release_lines() -> dict[str, int]:
    """Beat: release pending lines into free slots; hand finished batches to finalization."""
    report = release(runtime.get())
    celery = runtime.current_celery()
    for request_id in report.released:
        dispatch.enqueue_predict(celery, request_id, priority=Priority.BATCH.rank)
    for batch_id in report.finished:
        dispatch.enqueue_batch_task(celery, dispatch.TASK_BATCH_FINALIZE, batch_id)
    for task_name, batch_id in report.stale:
        logger.warning("batch %s looked stranded: sending %s again", batch_id, task_name)
        dispatch.enqueue_batch_task(celery, task_name, batch_id)
    return {"released": len(report.released), "finished": len(report.finished),
            "resent": len(report.stale)}


@shared_task(name=dispatch.TASK_BATCH_EXPIRE)
def expire_batches() -> int:
    """Beat: expire batches past their completion window."""
    expired = expire_due(runtime.get())
    for batch_id in expired:
        dispatch.enqueue_batch_task(runtime.current_celery(), dispatch.TASK_BATCH_FINALIZE,
                                    batch_id)
    return len(expired)


@shared_task(name=dispatch.TASK_BATCH_FINALIZE)
def finalize_batch(batch_id: str) -> str | None:
    """Withdraw what still runs, write the output and error files, close, send the event."""
    final = finalize(runtime.get(), batch_id)
    if final is not None:
        dispatch.enqueue_webhook(runtime.current_celery(), batch_id, EVENT_TYPES[final])
    return None if final is None else str(final)
