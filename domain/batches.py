"""The Batch API's domain, apart from HTTP: create, look up, list and cancel batches, count their
lines, and the OpenAI Batch object.

A batch is created `validating` and handed to the batch workers (`workers/batch`), which read its
input file into `batch_lines`, release the lines to the request pipeline at a fair pace, and write
the output and error files. Counts are aggregated in SQL from `batch_lines` and `requests`, so a
50,000-line batch is never loaded to be counted.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import IO, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from domain import batch_input, batch_models, dispatch, served_models
from domain.errors import Conflict, InvalidRequest, NotFound
from domain.file_bytes import file_store
from domain.file_quota import MAX_EXPIRES_AFTER_S, MIN_EXPIRES_AFTER_S
from domain.models import (
    Batch,
    BatchLine,
    BatchStatus,
    FilePurpose,
    InferenceRequest,
    LineStatus,
    RequestStatus,
    StoredFile,
    utcnow,
)
from domain.openai_schemas import body_model_for
from domain.pagination import Page, PageQuery, cursor_page
from domain.schemas import parse_body
from domain.services import Services

__all__ = ["CreateBatch", "OutputExpiresAfter", "LineCounts", "create_batch", "get_batch",
           "list_batches", "cancel_batch", "line_counts", "batch_to_dict", "batch_estimates",
           "new_batch_id",
           "STOPPABLE", "TERMINAL_BATCH_STATUSES", "EVENT_TYPES"]

#: The batch releaser's window of batch requests in flight (workers/batch/headroom_window.py):
#: JSON {"window", "num_waiting", "ttft_p99_s"} of its last round, read by /metrics.
BATCH_WINDOW_KEY = "blockq:batches:window"
#: Each running batch's completion estimate (workers/batch/estimates.py): a hash of batch id ->
#: JSON {"estimated_completion_at", "estimated_at", "meets_completion_window",
#: "remaining_lines", "lines_per_s"}, read by the Batch object and /metrics.
BATCH_ETA_KEY = "blockq:batches:eta"

logger = logging.getLogger(__name__)

#: Statuses a cancel or the completion window can still stop.
STOPPABLE = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)
TERMINAL_BATCH_STATUSES = frozenset({BatchStatus.COMPLETED, BatchStatus.FAILED,
                                     BatchStatus.EXPIRED, BatchStatus.CANCELLED})
#: The webhook event each terminal status sends (OpenAI's batch event types).
EVENT_TYPES = {status: f"batch.{status}" for status in TERMINAL_BATCH_STATUSES}
COMPLETION_WINDOWS = ("24h",)
MAX_METADATA_KEYS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


class OutputExpiresAfter(BaseModel):
    """OpenAI's expiration policy of a batch's output and error files: they expire `seconds`
    after they are created (the files' creation, not the batch's)."""

    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"]
    seconds: int = Field(ge=MIN_EXPIRES_AFTER_S, le=MAX_EXPIRES_AFTER_S, strict=True)


class CreateBatch(BaseModel):
    """Body of POST /v1/batches."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: OutputExpiresAfter | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return value
        if len(value) > MAX_METADATA_KEYS:
            raise ValueError(f"at most {MAX_METADATA_KEYS} keys")
        for key, item in value.items():
            if len(key) > MAX_METADATA_KEY_CHARS or len(item) > MAX_METADATA_VALUE_CHARS:
                raise ValueError(f"keys are at most {MAX_METADATA_KEY_CHARS} characters, "
                                 f"values at most {MAX_METADATA_VALUE_CHARS}")
        return value


def create_batch(services: Services, body: Any, *, team_id: str) -> Batch:
    """Validate, persist `validating`, then ask a batch worker to read the input file."""
    parsed = parse_body(CreateBatch, body)
    body_model_for(parsed.endpoint)  # 400 naming the endpoints we serve
    if parsed.completion_window not in COMPLETION_WINDOWS:
        raise InvalidRequest(f"Invalid completion_window '{parsed.completion_window}': only "
                             f"{', '.join(COMPLETION_WINDOWS)} is supported.",
                             param="completion_window", code="invalid_value")
    with services.db.session() as session:
        size_bytes = _check_input_file(session, parsed.input_file_id, team_id=team_id)
    # Read outside any transaction: counting the lines of 200 MB takes a moment.
    store = file_store(services.settings, services.db)
    batch_input.check_input_file(services.settings,
                                 lambda: store.open(parsed.input_file_id),
                                 size_bytes=size_bytes, param="input_file_id")
    model = _checked_model(services, lambda: store.open(parsed.input_file_id))
    expiry = parsed.output_expires_after
    now = utcnow()
    with services.outbox.transaction() as tx:
        session = tx.session
        _check_input_file(session, parsed.input_file_id, team_id=team_id)
        batch = Batch(id=new_batch_id(), team_id=team_id, status=BatchStatus.VALIDATING,
                      endpoint=parsed.endpoint, input_file_id=parsed.input_file_id,
                      completion_window=parsed.completion_window, batch_metadata=parsed.metadata,
                      model=model,
                      output_expires_after_s=None if expiry is None else expiry.seconds,
                      created_at=now, updated_at=now,
                      expires_at=now + timedelta(
                          seconds=services.settings.batch_completion_window_s))
        session.add(batch)
        tx.post(dispatch.batch_task(dispatch.TASK_BATCH_EXPAND, batch.id))
    return batch


def _checked_model(services: Services, open_file: Callable[[], IO[bytes]]) -> str | None:
    """The batch's model (its lines name one served model), or a 400 naming the line."""

    def is_served(model: str) -> bool:
        try:
            served_models.check(services.fleet, services.db, services.settings, model,
                                held=False)
        except NotFound:
            return False
        return True

    try:
        return batch_models.batch_model(open_file, is_served)
    except FileNotFoundError:
        return None  # expansion fails the batch with file_not_found


def _check_input_file(session: Session, file_id: str, *, team_id: str) -> int:
    """The team's batch input file's size in bytes, or a 400 naming what is wrong with it."""
    row = session.get(StoredFile, file_id)
    if row is None or row.team_id != team_id:
        raise InvalidRequest(f"No such File object: {file_id}", param="input_file_id",
                             code="invalid_value")
    if row.purpose != FilePurpose.BATCH:
        raise InvalidRequest(f"The input file must have purpose 'batch', '{file_id}' has "
                             f"'{row.purpose}'.", param="input_file_id", code="invalid_value")
    return row.size_bytes


def get_batch(session: Session, batch_id: str, *, team_id: str) -> Batch:
    batch = session.get(Batch, batch_id)
    if batch is None or batch.team_id != team_id:
        raise NotFound(f"No batch found with id '{batch_id}'.", param="id", code="not_found")
    return batch


def list_batches(session: Session, query: PageQuery, *, team_id: str) -> Page[Batch]:
    return cursor_page(session, Batch, query, [Batch.team_id == team_id])


def cancel_batch(services: Services, batch_id: str, *, team_id: str) -> None:
    """Start cancelling: the batch workers withdraw its unreleased lines, cancel its requests in
    flight and write what finished. Cancelling again is a no-op; a finished batch is a 409."""
    now = utcnow()
    with services.outbox.transaction() as tx:
        session = tx.session
        batch = get_batch(session, batch_id, team_id=team_id)
        changed = session.execute(
            update(Batch)
            .where(Batch.id == batch_id, Batch.status.in_([str(s) for s in STOPPABLE]))
            .values(status=BatchStatus.CANCELLING, final_status=BatchStatus.CANCELLED,
                    cancelling_at=now, updated_at=now)
            .execution_options(synchronize_session=False)
        ).rowcount  # type: ignore[attr-defined]
        session.refresh(batch)
        if batch.status not in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
            raise Conflict(f"Batch '{batch_id}' is already {batch.status}; it cannot be "
                           "cancelled.", param="id", code="batch_not_cancellable")
        if changed:
            tx.post(dispatch.batch_task(dispatch.TASK_BATCH_FINALIZE, batch_id))


@dataclass(frozen=True, slots=True)
class LineCounts:
    """A batch's lines by outcome, and the tokens of its succeeded requests."""

    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


def line_counts(session: Session, batch_ids: Iterable[str]) -> dict[str, LineCounts]:
    """Counts of many batches in two grouped queries (index-only on both tables).

    failed = lines refused at validation + requests that failed; a line cancelled or expired
    before it finished counts as neither completed nor failed, as in OpenAI's request_counts.
    """
    ids = list(batch_ids)
    if not ids:
        return {}
    totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    invalid = session.execute(
        select(BatchLine.batch_id, func.count())
        .where(BatchLine.batch_id.in_(ids), BatchLine.status == LineStatus.INVALID)
        .group_by(BatchLine.batch_id)
    )
    for batch_id, count in invalid:
        totals[batch_id]["failed"] += count
    finished = session.execute(
        select(InferenceRequest.batch_id, InferenceRequest.status, func.count(),
               func.coalesce(func.sum(InferenceRequest.prompt_tokens), 0),
               func.coalesce(func.sum(InferenceRequest.output_tokens), 0))
        .where(InferenceRequest.batch_id.in_(ids),
               InferenceRequest.status.in_([RequestStatus.SUCCEEDED, RequestStatus.FAILED]))
        .group_by(InferenceRequest.batch_id, InferenceRequest.status)
    )
    for batch_id, status, count, prompt_tokens, output_tokens in finished:
        if status == RequestStatus.FAILED:
            totals[batch_id]["failed"] += count
            continue
        totals[batch_id]["completed"] += count
        totals[batch_id]["input_tokens"] += int(prompt_tokens)
        totals[batch_id]["output_tokens"] += int(output_tokens)
    return {batch_id: LineCounts(**totals[batch_id]) for batch_id in ids}


def _unix(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


#: Stages with a `<stage>_at` timestamp (the same names in the table and in the Batch object).
_STAGES = ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling",
           "cancelled")


def batch_estimates(client: Any, batch_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The stored completion estimates of `batch_ids` (`BATCH_ETA_KEY`; absent: none yet)."""
    ids = list(batch_ids)
    if not ids:
        return {}
    raw = client.hmget(BATCH_ETA_KEY, ids)
    return {batch_id: json.loads(value) for batch_id, value in zip(ids, raw, strict=True)
            if value is not None}


def batch_to_dict(batch: Batch, counts: LineCounts,
                  estimate: dict[str, Any] | None = None) -> dict[str, Any]:
    """OpenAI's Batch object, with blockq's own fields under "blockq": the completion
    estimate (`estimated_completion_at`, `estimated_at`, `meets_completion_window`; null
    until the first one)."""
    body: dict[str, Any] = {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "model": batch.model,
        "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": _unix(batch.created_at),
        "expires_at": _unix(batch.expires_at),
    }
    for stage in _STAGES:
        body[f"{stage}_at"] = _unix(getattr(batch, f"{stage}_at"))
    body["request_counts"] = {"total": batch.num_lines or 0, "completed": counts.completed,
                              "failed": counts.failed}
    body["metadata"] = batch.batch_metadata
    body["usage"] = {
        "input_tokens": counts.input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": counts.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": counts.input_tokens + counts.output_tokens,
    }
    finished = batch.status not in STOPPABLE
    body["blockq"] = {"estimated_completion_at": None, "estimated_at": None,
                      "meets_completion_window": None, "remaining_lines": None,
                      "lines_per_s": None}
    if estimate is not None and not finished:
        body["blockq"].update({k: estimate.get(k) for k in body["blockq"]})
    return body
