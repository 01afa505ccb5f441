"""Celery tasks of the batches queue: thin adapters over expand, release, expiry and finalize."""

from __future__ import annotations

import logging

from celery import shared_task

from domain import dispatch
from workers import runtime
from workers.batch.estimates import estimate_batch, refresh_estimates
from workers.batch.expand import Expansion, expand
from workers.batch.expiry import expire_due
from workers.batch.finalize import finalize
from workers.batch.release import release
from workers.retries import ON_OUTAGE

logger = logging.getLogger(__name__)


@shared_task(name=dispatch.TASK_BATCH_EXPAND, **ON_OUTAGE)
def expand_batch(batch_id: str) -> str:
    """Read the input file into lines; a batch stopped meanwhile goes on to finalization."""
    outcome = expand(runtime.get(), batch_id)
    if outcome is Expansion.STARTED:
        # Validated: its completion estimate, on the bulk predictor (a lost one: beat's next).
        dispatch.batch_estimate(batch_id).send(runtime.current_celery(), retry=False)
    if outcome is Expansion.STOPPED:
        # NOTE: a plain send: the batch is cancelling, and the releaser resends a lost one.
        dispatch.batch_task(dispatch.TASK_BATCH_FINALIZE, batch_id).send(
            runtime.current_celery())
    return outcome.value


@shared_task(name=dispatch.TASK_BATCH_RELEASE)
def release_lines() -> dict[str, int]:
    """Beat: release pending lines into free slots; hand finished batches to finalization."""
    report = release(runtime.get())
    celery = runtime.current_celery()
    for task_name, batch_id in report.stale:
        logger.warning("batch %s looked stranded: sending %s again", batch_id, task_name)
        dispatch.batch_task(task_name, batch_id).send(celery)
    return {"released": len(report.released), "finished": len(report.finished),
            "resent": len(report.stale)}


@shared_task(name=dispatch.TASK_BATCH_EXPIRE)
def expire_batches() -> int:
    """Beat: expire batches past their completion window (and send them to finalization)."""
    return len(expire_due(runtime.get()))


@shared_task(name=dispatch.TASK_BATCH_ESTIMATE)
def estimate_completion(batch_id: str) -> int | None:
    """A batch's completion estimate (as it is validated); the unix time, or None."""
    record = estimate_batch(runtime.get(), batch_id)
    if record is not None and not record.meets_completion_window:
        logger.warning("batch %s cannot meet its completion window: estimated to finish at "
                       "%d", batch_id, record.estimated_completion_at)
    return None if record is None else record.estimated_completion_at


@shared_task(name=dispatch.TASK_BATCH_ESTIMATES)
def estimate_completions() -> int:
    """Beat: every running batch's completion estimate again; how many were estimated."""
    return len(refresh_estimates(runtime.get()))


@shared_task(name=dispatch.TASK_BATCH_FINALIZE, **ON_OUTAGE)
def finalize_batch(batch_id: str) -> str | None:
    """Withdraw what still runs, write the output and error files, close, send the event."""
    final = finalize(runtime.get(), batch_id)
    return None if final is None else str(final)
