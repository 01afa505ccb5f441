"""Expansion: read a `validating` batch's input file into `batch_lines`, then start it.

The file is streamed line by line and the lines are inserted a chunk at a time, each chunk in
its own transaction, so a 50,000-line file never sits in memory. A bad line becomes an `invalid`
line (it fails alone); the file as a whole fails the batch only when it is missing, too large,
has too many lines, or has no valid line at all (`errors` then lists the line errors).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from sqlalchemy import delete, func, insert, update

from domain import dispatch
from domain.batches import EVENT_TYPES
from domain.file_bytes import file_store
from domain.models import Batch, BatchLine, BatchStatus, LineStatus, utcnow
from domain.request_store import new_request_id
from domain.settings import Settings
from workers.batch.lines import CheckedLine, LineChecker, LineError
from workers.batch.locks import LOCK_TTL_S, batch_lock_name
from workers.batch.prefix_groups import PrefixGroups
from workers.locks import held
from workers.runtime import Runtime

__all__ = ["Expansion", "expand", "physical_lines"]

CHUNK_LINES = 1000
#: Line errors a failed batch lists in `errors` (the first ones).
MAX_REPORTED_ERRORS = 100
_READ_CHUNK_BYTES = 1 << 16


class Expansion(enum.Enum):
    STARTED = "started"  # in_progress: its lines wait for the releaser
    FAILED = "failed"  # the file failed the batch
    STOPPED = "stopped"  # cancelled or expired while validating: finalization takes over
    SKIPPED = "skipped"  # nothing to do (not validating, or another worker has it)


class _Stopped(Exception):
    """The batch left `validating` while its lines were being read."""


@dataclass
class _Tally:
    num_lines: int = 0
    num_valid: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)  # the first line errors
    groups: PrefixGroups = field(default_factory=PrefixGroups)  # the valid lines' prefix groups


def expand(rt: Runtime, batch_id: str) -> Expansion:
    """Read the batch's input file into lines and start it (or fail it). Safe to rerun: a rerun
    of an interrupted expansion deletes the lines it had written and starts over."""
    with held(rt.redis, batch_lock_name(batch_id), ttl_s=LOCK_TTL_S, renew=True) as mine:
        if not mine:
            return Expansion.SKIPPED
        with rt.db.session() as session:
            batch = session.get(Batch, batch_id)
            if batch is None or batch.status != BatchStatus.VALIDATING:
                return Expansion.SKIPPED
            session.execute(delete(BatchLine).where(BatchLine.batch_id == batch_id))
        try:
            tally_or_errors = _read(rt, batch)
        except _Stopped:
            return Expansion.STOPPED
        if isinstance(tally_or_errors, list):
            return _fail(rt, batch_id, tally_or_errors)
        return _start(rt, batch_id, tally_or_errors)


def _read(rt: Runtime, batch: Batch) -> _Tally | list[dict[str, Any]]:
    """The lines, inserted; or the errors that fail the whole file."""
    settings = rt.settings
    try:
        handle = file_store(settings, rt.db).open(batch.input_file_id)
    except FileNotFoundError:
        return [_batch_error("file_not_found", f"The input file {batch.input_file_id} no "
                             "longer exists.", param="input_file_id")]
    checker = LineChecker(batch.endpoint, rt, batch.model)
    tally, chunk = _Tally(), []
    with handle:
        for number, raw in enumerate(physical_lines(handle, settings.max_request_bytes), 1):
            if raw is not None and not raw.strip():
                continue  # blank lines are not requests
            tally.num_lines += 1
            if tally.num_lines > settings.max_batch_lines:
                _discard_lines(rt, batch.id)
                return [_batch_error("too_many_lines", f"The input file has more than "
                                     f"{settings.max_batch_lines} requests.", line=number)]
            chunk.append(_line_row(batch.id, number, _check(checker, raw, settings), tally))
            if len(chunk) >= CHUNK_LINES:
                _insert(rt, batch.id, chunk)
                chunk = []
    _insert(rt, batch.id, chunk)
    if tally.num_lines == 0:
        return [_batch_error("empty_file", "The input file has no requests.")]
    if tally.num_valid == 0:
        _discard_lines(rt, batch.id)
        return tally.errors
    return tally


def physical_lines(handle: IO[bytes], max_bytes: int) -> Iterator[bytes | None]:
    """Each line of the file without its line end, in order; None for a line longer than
    `max_bytes` (read past without keeping it)."""
    while raw := handle.readline(max_bytes + 1):
        if len(raw) > max_bytes and not raw.endswith(b"\n"):
            while (rest := handle.readline(_READ_CHUNK_BYTES)) and not rest.endswith(b"\n"):
                pass
            yield None
            continue
        yield raw.rstrip(b"\r\n")


def _check(checker: LineChecker, raw: bytes | None, settings: Settings) -> CheckedLine:
    if raw is None:
        return CheckedLine(None, None, LineError(
            "line_too_long", f"This line is longer than {settings.max_request_bytes} bytes, "
            "the largest request body accepted."))
    return checker.check(raw)


def _line_row(batch_id: str, number: int, checked: CheckedLine, tally: _Tally
              ) -> dict[str, Any]:
    group = None
    if checked.error is None:
        tally.num_valid += 1
        group = tally.groups.group_of(number, checked.prefix_key)
    elif len(tally.errors) < MAX_REPORTED_ERRORS:
        tally.errors.append(_batch_error(checked.error.code, checked.error.message,
                                         param=checked.error.param, line=number))
    return {
        "batch_id": batch_id,
        "line": number,
        "custom_id": checked.custom_id,
        "status": LineStatus.PENDING if checked.error is None else LineStatus.INVALID,
        "request_id": new_request_id(),
        "fields": checked.fields,
        "error": None if checked.error is None else checked.error.to_dict(),
        "prefix_group": group,
    }


def _insert(rt: Runtime, batch_id: str, rows: list[dict[str, Any]]) -> None:
    """One chunk, in its own transaction, while the batch is still validating."""
    with rt.db.session() as session:
        still_validating = session.execute(
            update(Batch)
            .where(Batch.id == batch_id, Batch.status == BatchStatus.VALIDATING)
            .values(updated_at=utcnow())
            .execution_options(synchronize_session=False)
        ).rowcount  # type: ignore[attr-defined]
        if not still_validating:
            raise _Stopped(batch_id)
        if rows:
            session.execute(insert(BatchLine), rows)


def _discard_lines(rt: Runtime, batch_id: str) -> None:
    with rt.db.session() as session:
        session.execute(delete(BatchLine).where(BatchLine.batch_id == batch_id))


def _fail(rt: Runtime, batch_id: str, errors: list[dict[str, Any]]) -> Expansion:
    now = utcnow()
    with rt.outbox.transaction() as tx:
        failed = tx.session.execute(
            update(Batch)
            .where(Batch.id == batch_id, Batch.status == BatchStatus.VALIDATING)
            .values(status=BatchStatus.FAILED, final_status=BatchStatus.FAILED, errors=errors,
                    failed_at=now, updated_at=now)
            .execution_options(synchronize_session=False)
        ).rowcount  # type: ignore[attr-defined]
        if failed:
            tx.post(dispatch.webhook(batch_id, EVENT_TYPES[BatchStatus.FAILED]))
    return Expansion.FAILED if failed else Expansion.STOPPED


def _start(rt: Runtime, batch_id: str, tally: _Tally) -> Expansion:
    now = utcnow()
    with rt.db.session() as session:
        started = session.execute(
            update(Batch)
            .where(Batch.id == batch_id, Batch.status == BatchStatus.VALIDATING)
            .values(status=BatchStatus.IN_PROGRESS, num_lines=tally.num_lines,
                    model=func.coalesce(Batch.model, rt.settings.default_model),
                    in_progress_at=now, updated_at=now)
            .execution_options(synchronize_session=False)
        ).rowcount  # type: ignore[attr-defined]
    return Expansion.STARTED if started else Expansion.STOPPED


def _batch_error(code: str, message: str, *, param: str | None = None,
                 line: int | None = None) -> dict[str, Any]:
    """OpenAI's BatchError."""
    return {"code": code, "message": message, "param": param, "line": line}

