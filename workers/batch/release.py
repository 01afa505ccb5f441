"""The releaser: turns pending batch lines into requests, a fair share at a time, and hands
batches whose lines all finished to finalization.

Run by beat every `batch_release_interval_s` (one run at a time, under a Redis lock). A released
line becomes an ordinary request (priority `batch`, status `queued`, committed first, then sent
to predict), so it goes through predict -> route -> engine like any other, behind interactive
requests in every queue and engine. At most `max_batch_in_flight` batch requests are unfinished
at once, over all batches; the free slots are shared among teams by `teams.share`
(workers.batch.fair_share). Within a batch, lines go by prefix group, then file order
(`RELEASE_ORDER`): lines whose prompts share a prefix run one after another, where the
engines' prefix cache can serve them (workers.batch.prefix_groups).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import exists, func, insert, select, update
from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.orm import Session

from domain import dispatch
from domain.db import TRANSIENT_ERRORS
from domain.models import (
    Batch,
    BatchLine,
    BatchStatus,
    InferenceRequest,
    LineStatus,
    Priority,
    RequestEvent,
    RequestStatus,
    Team,
    utcnow,
)
from domain.request_store import ACTIVE_STATUSES
from workers.batch.fair_share import Flow, allocate
from workers.batch.headroom_window import batch_window, pool_weights
from workers.batch.locks import RELEASER_LOCK
from workers.locks import held
from workers.runtime import Runtime

__all__ = ["RELEASE_ORDER", "ReleaseReport", "release", "finish_done", "recover_stale"]

logger = logging.getLogger(__name__)

_ACTIVE = [str(s) for s in ACTIVE_STATUSES]
#: The order a batch's pending lines are released in (ix_batch_lines_batch_id_status_prefix_group
#: serves it): by prefix group, groups in order of first appearance, file order within one. A
#: batch expanded before groups existed has none (NULL) on every line: file order.
RELEASE_ORDER = (BatchLine.prefix_group, BatchLine.line)


@dataclass
class ReleaseReport:
    released: list[str] = field(default_factory=list)  # request ids, sent to predict
    finished: list[str] = field(default_factory=list)  # batch ids, sent to finalize
    stale: list[tuple[str, str]] = field(default_factory=list)  # (task name, batch id) to resend


def release(rt: Runtime) -> ReleaseReport:
    """One round: release lines into free slots, then mark finished batches `finalizing`."""
    report = ReleaseReport()
    with held(rt.redis, RELEASER_LOCK, ttl_s=60) as mine:
        if not mine:
            return report
        with rt.db.session() as session:
            flows, num_in_flight = _flows(session)
        grants = allocate(flows, batch_window(rt) - num_in_flight, pool_weights(rt.fleet))
        teams = {f.batch_id: f.team_id for f in flows}
        for batch_id, count in grants.items():
            report.released += _release_batch(rt, batch_id, teams[batch_id], count)
        report.finished = finish_done(rt)
        report.stale = recover_stale(rt)
    return report


def _release_batch(rt: Runtime, batch_id: str, team_id: str, count: int) -> list[str]:
    """Release the batch's grant in one transaction. Should that fail for a reason other than
    an outage, the lines go one at a time: a line the database refuses (a value expansion let
    through) fails alone, and one batch's trouble never aborts the round for the others."""
    try:
        return _release_lines(rt, batch_id, team_id, count)
    except TRANSIENT_ERRORS:
        raise  # the database is down for every batch: the next round retries
    except Exception as exc:  # noqa: BLE001 - isolated to this batch, see below
        logger.warning("releasing %d line(s) of %s failed (%s): releasing them one at a time",
                       count, batch_id, _reason(exc))
    with rt.db.session() as session:
        numbers = list(session.scalars(
            select(BatchLine.line)
            .where(BatchLine.batch_id == batch_id, BatchLine.status == LineStatus.PENDING)
            .order_by(*RELEASE_ORDER).limit(count)))
    released: list[str] = []
    for number in numbers:
        try:
            released += _release_lines(rt, batch_id, team_id, 1, line=number)
        except TRANSIENT_ERRORS:
            raise
        except _LINE_REFUSED as exc:
            _fail_line(rt, batch_id, number, exc)
        except Exception as exc:  # noqa: BLE001 - not the line's fault: retried next round
            logger.warning("releasing %s line %d failed (%s): retried next round", batch_id,
                           number, _reason(exc))
            break
    return released


def _release_lines(rt: Runtime, batch_id: str, team_id: str, count: int, *,
                   line: int | None = None) -> list[str]:
    with rt.outbox.transaction() as tx:
        claimed = _claim(tx.session, batch_id, team_id, count, line=line)
        for request_id in claimed:
            tx.post(dispatch.predict(request_id, priority=Priority.BATCH.rank))
    return claimed


#: What a line's own values cause when the database refuses them: NUL in text, NaN in json
#: (DataError), a lone surrogate (UnicodeEncodeError, a ValueError), a duplicate id
#: (IntegrityError), a pending line without its fields (TypeError).
_LINE_REFUSED = (DataError, IntegrityError, ValueError, TypeError, AssertionError)


def _fail_line(rt: Runtime, batch_id: str, number: int, exc: Exception) -> None:
    """The line fails alone, as a 500 in the error file; logged once (it is pending no more)."""
    logger.error("%s line %d cannot be released and fails: %s", batch_id, number, _reason(exc))
    error = {"code": "line_refused", "type": "server_error", "param": None, "status_code": 500,
             "message": "The line's request could not be stored to run: the database refused "
                        f"one of its values ({type(exc).__name__})."}
    with rt.db.session() as session:
        session.execute(
            update(BatchLine)
            .where(BatchLine.batch_id == batch_id, BatchLine.line == number,
                   BatchLine.status == LineStatus.PENDING)
            .values(status=LineStatus.INVALID, fields=None, error=error)
            .execution_options(synchronize_session=False))


def _reason(exc: Exception) -> str:
    """The error's class and first line (the statement's values are hidden: hide_parameters)."""
    text = str(getattr(exc, "orig", None) or exc)
    return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"


def _flows(session: Session) -> tuple[list[Flow], int]:
    """Active batches (oldest first) with their in-flight and pending counts, and the in-flight
    count over all batches (stopping ones included: their slots are not free yet)."""
    in_flight = dict(session.execute(  # type: ignore[arg-type]
        select(InferenceRequest.batch_id, func.count())
        .where(InferenceRequest.batch_id.is_not(None), InferenceRequest.status.in_(_ACTIVE))
        .group_by(InferenceRequest.batch_id)
    ).all())
    active = session.execute(
        select(Batch.id, Batch.team_id, Team.share, Batch.expires_at, Batch.model)
        .join(Team, Team.id == Batch.team_id)
        .where(Batch.status == BatchStatus.IN_PROGRESS)
        .order_by(Batch.created_at, Batch.id)
    ).all()
    pending = dict(session.execute(  # type: ignore[arg-type]
        select(BatchLine.batch_id, func.count())
        .where(BatchLine.batch_id.in_([row.id for row in active]),
               BatchLine.status == LineStatus.PENDING)
        .group_by(BatchLine.batch_id)
    ).all()) if active else {}
    flows = [Flow(batch_id=row.id, team_id=row.team_id, share=row.share,
                  num_in_flight=in_flight.get(row.id, 0), num_pending=pending.get(row.id, 0),
                  deadline=row.expires_at.timestamp(), model=row.model or "")
             for row in active]
    return flows, sum(in_flight.values())


def _claim(session: Session, batch_id: str, team_id: str, count: int, *,
           line: int | None = None) -> list[str]:
    """Release the batch's next `count` pending lines (or only `line`), in `RELEASE_ORDER`:
    mark them released and insert their requests, in one transaction. Returns the new request ids.

    NOTE: the lines are locked (FOR UPDATE on PostgreSQL) and the UPDATE re-checks `pending`,
    so a cancel or expiry that withdraws the batch's pending lines concurrently either waits
    for this release and then cancels its requests, or withdraws the lines first.
    """
    only = [] if line is None else [BatchLine.line == line]
    rows = session.execute(
        select(BatchLine.line, BatchLine.custom_id, BatchLine.request_id, BatchLine.fields)
        .where(BatchLine.batch_id == batch_id, BatchLine.status == LineStatus.PENDING, *only)
        .order_by(*RELEASE_ORDER)
        .limit(count)
        .with_for_update(skip_locked=True)
    ).all()
    if not rows:
        return []
    claimed = set(session.scalars(
        update(BatchLine)
        .where(BatchLine.batch_id == batch_id, BatchLine.line.in_([r.line for r in rows]),
               BatchLine.status == LineStatus.PENDING)
        .values(status=LineStatus.RELEASED, fields=None)
        .returning(BatchLine.line)
        .execution_options(synchronize_session=False)
    ).all())
    now = utcnow()
    requests = [_request_row(row, batch_id, team_id, now) for row in rows if row.line in claimed]
    if requests:
        session.execute(insert(InferenceRequest), requests)
        session.execute(insert(RequestEvent), [
            {"request_id": r["id"], "status": RequestStatus.QUEUED, "at": now,
             "detail": f"released from {batch_id} line {r['batch_line']}"} for r in requests])
    return [r["id"] for r in requests]


def _request_row(row: Any, batch_id: str, team_id: str, now: Any) -> dict[str, Any]:
    assert row.fields is not None, f"pending line {row.line} of {batch_id} has no fields"
    return {**row.fields, "id": row.request_id, "team_id": team_id,
            "status": RequestStatus.QUEUED, "batch_id": batch_id, "custom_id": row.custom_id,
            "batch_line": row.line, "created_at": now}


def finish_done(rt: Runtime) -> list[str]:
    """Move `in_progress` batches with no pending line and no unfinished request to
    `finalizing`, and send them to finalization; returns their ids."""
    now = utcnow()
    no_pending = ~exists().where(BatchLine.batch_id == Batch.id,
                                 BatchLine.status == LineStatus.PENDING)
    none_in_flight = ~exists().where(InferenceRequest.batch_id == Batch.id,
                                     InferenceRequest.status.in_(_ACTIVE))
    with rt.outbox.transaction() as tx:
        finished = list(tx.session.scalars(
            update(Batch)
            .where(Batch.status == BatchStatus.IN_PROGRESS, no_pending, none_in_flight)
            .values(status=BatchStatus.FINALIZING, final_status=BatchStatus.COMPLETED,
                    finalizing_at=now, updated_at=now)
            .returning(Batch.id)
            .execution_options(synchronize_session=False)
        ).all())
        for batch_id in finished:
            tx.post(dispatch.batch_task(dispatch.TASK_BATCH_FINALIZE, batch_id))
    return finished


#: The task that moves a batch on from each status where only a task can.
_RESUME = {
    BatchStatus.VALIDATING: dispatch.TASK_BATCH_EXPAND,
    BatchStatus.FINALIZING: dispatch.TASK_BATCH_FINALIZE,
    BatchStatus.CANCELLING: dispatch.TASK_BATCH_FINALIZE,
}


def recover_stale(rt: Runtime) -> list[tuple[str, str]]:
    """Batches stuck where a task should be working on them (its message lost: the broker was
    down when it was sent, or a worker died with it) for `stale_queued_after_s`: touched, and
    returned with the task to send again. The per-batch lock makes a resend harmless."""
    cutoff = utcnow() - timedelta(seconds=rt.settings.stale_queued_after_s)
    with rt.db.session() as session:
        rows = session.execute(
            update(Batch)
            .where(Batch.status.in_([str(s) for s in _RESUME]), Batch.updated_at < cutoff)
            .values(updated_at=utcnow())
            .returning(Batch.id, Batch.status)
            .execution_options(synchronize_session=False)
        ).all()
    return [(_RESUME[BatchStatus(status)], batch_id) for batch_id, status in rows]
