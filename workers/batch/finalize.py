"""Finalization: withdraw what still runs, write the output and error files, set the terminal
status (completed, cancelled or expired, as `final_status` says).

The files are written by streaming the batch's lines in file order, joined with their requests,
straight into the files directory; only then, in one transaction, are they registered and the
batch closed. A crash before that commit leaves the batch `finalizing` / `cancelling`, and the
releaser's stale sweep sends finalization again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select, update

from domain import dispatch, request_store
from domain.batches import EVENT_TYPES
from domain.file_bytes import FileStore, file_store
from domain.file_quota import expires_at_of
from domain.file_records import new_file_id, register_file
from domain.models import (
    Batch,
    BatchLine,
    BatchStatus,
    FilePurpose,
    InferenceRequest,
    LineStatus,
    RequestStatus,
    utcnow,
)
from workers.batch.locks import LOCK_TTL_S, batch_lock_name
from workers.batch.output import LineRow, result_of
from workers.locks import held
from workers.runtime import Runtime

__all__ = ["finalize", "withdraw"]

#: Rows fetched at a time while the files are written.
STREAM_ROWS = 1000
_FINALIZABLE = (BatchStatus.FINALIZING, BatchStatus.CANCELLING)


@dataclass(frozen=True, slots=True)
class _Written:
    kind: str  # "output" | "error"
    file_id: str
    num_lines: int


def finalize(rt: Runtime, batch_id: str) -> BatchStatus | None:
    """Finish the batch; returns the terminal status set, or None when there was nothing to do
    (not finalizing or cancelling, or another worker holds the batch)."""
    with held(rt.redis, batch_lock_name(batch_id), ttl_s=LOCK_TTL_S, renew=True) as mine:
        if not mine:
            return None
        with rt.db.session() as session:
            batch = session.get(Batch, batch_id)
        if batch is None or batch.status not in _FINALIZABLE:
            return None
        final = BatchStatus(batch.final_status)
        if batch.in_progress_at is None:
            _discard_lines(rt, batch_id)  # stopped while validating: nothing ever ran
        else:
            withdraw(rt, batch_id, final)
        written = _write(rt, batch, final)
        return final if _close(rt, batch, final, written) else None


def withdraw(rt: Runtime, batch_id: str, final: BatchStatus) -> list[str]:
    """Unreleased lines never run; requests in flight are cancelled the way POST
    /v1/requests/<id>/cancel cancels them (the guarded transition, then the cancel flag the
    engine aborts on). Returns the cancelled request ids. A completed batch has neither."""
    now = utcnow()
    with rt.db.session() as session:
        session.execute(
            update(BatchLine)
            .where(BatchLine.batch_id == batch_id, BatchLine.status == LineStatus.PENDING)
            .values(status=LineStatus.CANCELLED, fields=None)
            .execution_options(synchronize_session=False)
        )
        in_flight = session.scalars(
            select(InferenceRequest.id)
            .where(InferenceRequest.batch_id == batch_id,
                   InferenceRequest.status.in_([str(s) for s in request_store.ACTIVE_STATUSES]))
        ).all()
        cancelled = [
            request_id for request_id in in_flight
            if request_store.transition(session, request_id, RequestStatus.CANCELLED,
                                allowed_from=request_store.ACTIVE_STATUSES,
                                detail=f"cancelled: batch {batch_id} {final}", finished_at=now)
        ]
    for request_id in cancelled:
        rt.fleet.request_cancel(request_id)
    return cancelled


def _discard_lines(rt: Runtime, batch_id: str) -> None:
    with rt.db.session() as session:
        session.execute(delete(BatchLine).where(BatchLine.batch_id == batch_id))


def _write(rt: Runtime, batch: Batch, final: BatchStatus) -> list[_Written]:
    """Both files, streamed from the lines in order (each line's result goes to one of them)."""
    files = file_store(rt.settings, rt.db)
    output_id, error_id = new_file_id(), new_file_id()
    num_lines = {True: 0, False: 0}
    model = batch.model or rt.settings.default_model
    with (files.writer(output_id) as output, files.writer(error_id) as errors,
          rt.db.session() as session):
        rows = session.execute(
            select(BatchLine.line, BatchLine.custom_id, BatchLine.status, BatchLine.request_id,
                   BatchLine.error, InferenceRequest)
            .outerjoin(InferenceRequest, InferenceRequest.id == BatchLine.request_id)
            .where(BatchLine.batch_id == batch.id)
            .order_by(BatchLine.line)
            .execution_options(yield_per=STREAM_ROWS)
        )
        for line, custom_id, status, request_id, error, request in rows:
            result = result_of(batch.id, batch.endpoint, model, final,
                               LineRow(line, custom_id, status, request_id, error, request))
            target = output if result.succeeded else errors
            target.write(json.dumps(result.body, ensure_ascii=False).encode() + b"\n")
            num_lines[result.succeeded] += 1
    return [_Written("output", output_id, num_lines[True]),
            _Written("error", error_id, num_lines[False])]


def _close(rt: Runtime, batch: Batch, final: BatchStatus, written: list[_Written]) -> bool:
    """Register the non-empty files and set the terminal status, in one transaction."""
    files = file_store(rt.settings, rt.db)
    kept = {w.kind: w for w in written if w.num_lines}
    now = utcnow()
    try:
        with rt.outbox.transaction() as tx:
            session = tx.session
            for w in kept.values():
                row = register_file(session, file_id=w.file_id, team_id=batch.team_id,
                                    purpose=FilePurpose.BATCH_OUTPUT,
                                    filename=f"{batch.id}_{w.kind}.jsonl",
                                    size_bytes=files.size(w.file_id))
                row.expires_at = _output_expiry(batch, row.created_at)
            closed = session.execute(
                update(Batch)
                .where(Batch.id == batch.id, Batch.status == batch.status)
                .values(status=final, updated_at=now, **{f"{final}_at": now},
                        output_file_id=kept["output"].file_id if "output" in kept else None,
                        error_file_id=kept["error"].file_id if "error" in kept else None)
                .execution_options(synchronize_session=False)
            ).rowcount  # type: ignore[attr-defined]
            if not closed:
                raise _Superseded(batch.id)
            tx.post(dispatch.webhook(batch.id, EVENT_TYPES[final]))
    except _Superseded:
        _delete(files, written)
        return False
    except BaseException:
        _delete(files, written)
        raise
    _delete(files, [w for w in written if not w.num_lines])
    return True


def _output_expiry(batch: Batch, created_at: datetime) -> datetime | None:
    """When an output or error file expires: OpenAI's `output_expires_after` counts from the
    file's creation."""
    return expires_at_of(created_at, batch.output_expires_after_s)


class _Superseded(Exception):
    """The batch left the status finalization started from (nothing else should move it)."""


def _delete(files: FileStore, written: list[_Written]) -> None:
    for w in written:
        files.delete(w.file_id)
