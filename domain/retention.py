"""The retention purge: deletes what blockq keeps longer than its settings say, in short chunks.

Each table has its own age (`Settings.retain_*_days`, 0 keeps forever): finished requests (their
events and webhook deliveries go with them, by foreign-key cascade), the request history
(`request_outcomes`, which holds every team's prompts), engine step samples, webhook delivery
attempts, finished batches, candidate and retired model versions, and files past their
`expires_at` (row and bytes).

Safety, each by construction:

- **Never work in flight.** Only terminal requests whose batch (if any) is terminal too; only
  terminal batches with no request left; never the active model version nor each scope's
  rollback target; never the input file of a batch still running.
- **No giant transaction, no table lock.** Each chunk (`purge_chunk_rows` rows) is one short
  transaction: select its keys with `FOR UPDATE SKIP LOCKED`, delete them, commit.
- **Idempotent, safe to run twice at once.** A second purge skips the rows the first has locked
  and finds nothing left of what the first deleted. (SQLite has one writer at a time anyway.)
- **Bounded runs.** Given `max_run_s`, a run stops between two chunks once that time is spent
  and the next run goes on from there, so the first purge of a large history never holds a
  worker thread for hours.

The outbox is not purged: an entry there is a message not sent yet, and the health worker's
relay drains it; deleting one would lose the message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Select, delete, exists, func, select
from sqlalchemy.orm import Session, aliased

from domain.db import Database
from domain.file_bytes import FileStore, file_store
from domain.models import (
    TERMINAL_STATUSES,
    Batch,
    BatchStatus,
    EngineStepSample,
    InferenceRequest,
    ModelStatus,
    ModelVersion,
    RequestOutcome,
    StoredFile,
    WebhookDelivery,
    utcnow,
)
from domain.settings import Settings

__all__ = ["RetentionPolicy", "Purge", "purge"]

logger = logging.getLogger(__name__)

_TERMINAL_REQUESTS = [str(s) for s in TERMINAL_STATUSES]
_TERMINAL_BATCHES = [str(s) for s in (BatchStatus.COMPLETED, BatchStatus.FAILED,
                                      BatchStatus.EXPIRED, BatchStatus.CANCELLED)]
_RUNNING_BATCHES = [str(s) for s in BatchStatus if str(s) not in _TERMINAL_BATCHES]
#: Model versions carry their artifact (megabytes): fewer per chunk.
_MODEL_VERSION_CHUNK = 10


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long each kind of row is kept; None keeps it forever."""

    requests: timedelta | None
    outcomes: timedelta | None
    step_samples: timedelta | None
    webhook_deliveries: timedelta | None
    batches: timedelta | None
    model_versions: timedelta | None

    @classmethod
    def of(cls, settings: Settings) -> RetentionPolicy:
        def days(value: float) -> timedelta | None:
            return timedelta(days=value) if value > 0 else None

        return cls(requests=days(settings.retain_requests_days),
                   outcomes=days(settings.retain_outcomes_days),
                   step_samples=days(settings.retain_step_samples_days),
                   webhook_deliveries=days(settings.retain_webhook_deliveries_days),
                   batches=days(settings.retain_batches_days),
                   model_versions=days(settings.retain_model_versions_days))


class Purge:
    """One purge run over every table, chunk by chunk (module docstring)."""

    def __init__(self, db: Database, files: FileStore, policy: RetentionPolicy, *,
                 chunk_rows: int) -> None:
        self.db = db
        self.files = files
        self.policy = policy
        self.chunk_rows = chunk_rows
        self._deadline: float | None = None

    def run(self, now: datetime | None = None, *,
            max_run_s: float | None = None) -> dict[str, int]:
        """Rows deleted per table (files: rows, each with its bytes); with `max_run_s`, what
        was deleted until that time was spent (the tables not reached yet report 0)."""
        now = now or utcnow()
        self._deadline = None if max_run_s is None else time.monotonic() + max_run_s
        p = self.policy
        steps: list[tuple[str, timedelta | None, Callable[[datetime], Select[tuple[object]]],
                          int]] = [
            ("requests", p.requests, _requests, self.chunk_rows),
            ("request_outcomes", p.outcomes, _outcomes, self.chunk_rows),
            ("engine_step_samples", p.step_samples, _step_samples, self.chunk_rows),
            ("webhook_deliveries", p.webhook_deliveries, _deliveries, self.chunk_rows),
            ("batches", p.batches, _batches, self.chunk_rows),
            ("model_versions", p.model_versions, _model_versions,
             min(self.chunk_rows, _MODEL_VERSION_CHUNK)),
        ]
        report: dict[str, int] = {}
        for name, age, keys, chunk in steps:
            if age is not None:
                report[name] = self._delete_chunks(keys(now - age), chunk)
        report["files"] = self._delete_expired_files(now)
        return report

    def _delete_chunks(self, keys: Select[tuple[object]], chunk: int) -> int:
        """Delete the rows `keys` selects (their primary keys), `chunk` per transaction."""
        column = keys.selected_columns[0]
        table = column.table
        deleted = 0
        while not self._out_of_time():
            with self.db.session() as session:
                ids = _lock(session, keys, chunk)
                if ids:
                    session.execute(delete(table).where(column.in_(ids)))
            deleted += len(ids)
            if len(ids) < chunk:
                break
        return deleted

    def _delete_expired_files(self, now: datetime) -> int:
        """Files past expires_at: bytes first, then the row, in the transaction holding the
        row's lock (a crash in between leaves a row without bytes, which the next run
        deletes; never bytes without a row, which nothing would find again)."""
        deleted = 0
        while not self._out_of_time():
            with self.db.session() as session:
                ids = _lock(session, _expired_files(now), self.chunk_rows)
                for file_id in ids:
                    self.files.delete(str(file_id))
                if ids:
                    session.execute(delete(StoredFile).where(StoredFile.id.in_(ids)))
            deleted += len(ids)
            if len(ids) < self.chunk_rows:
                break
        return deleted

    def _out_of_time(self) -> bool:
        return self._deadline is not None and time.monotonic() > self._deadline


def _lock(session: Session, keys: Select[tuple[object]], chunk: int) -> list[object]:
    table = keys.selected_columns[0].table
    return list(session.scalars(
        keys.limit(chunk).with_for_update(skip_locked=True, of=table)))


# --- what each table may lose ------------------------------------------------------------------
def _requests(cutoff: datetime) -> Select[tuple[object]]:
    """Terminal requests finished before `cutoff`, unless their batch still runs (its
    finalization reads them)."""
    r = InferenceRequest
    batch_running = exists().where(Batch.id == r.batch_id, Batch.status.in_(_RUNNING_BATCHES))
    return select(r.id).where(r.status.in_(_TERMINAL_REQUESTS), r.updated_at < cutoff,
                              ~batch_running)


def _outcomes(cutoff: datetime) -> Select[tuple[object]]:
    return select(RequestOutcome.request_id).where(RequestOutcome.finished_at < cutoff)


def _step_samples(cutoff: datetime) -> Select[tuple[object]]:
    return select(EngineStepSample.id).where(EngineStepSample.at < cutoff)


def _deliveries(cutoff: datetime) -> Select[tuple[object]]:
    return select(WebhookDelivery.id).where(WebhookDelivery.at < cutoff)


def _batches(cutoff: datetime) -> Select[tuple[object]]:
    """Terminal batches finished before `cutoff` none of whose requests is left (their lines
    and webhook deliveries go with them)."""
    has_requests = exists().where(InferenceRequest.batch_id == Batch.id)
    return select(Batch.id).where(Batch.status.in_(_TERMINAL_BATCHES), Batch.updated_at < cutoff,
                                  ~has_requests)


def _model_versions(cutoff: datetime) -> Select[tuple[object]]:
    """Candidate and retired versions created before `cutoff`, except each scope's rollback
    target: its retired version promoted last (domain.model_registry.rollback)."""
    mv, other = ModelVersion, aliased(ModelVersion)
    last_promoted = (select(func.max(other.promoted_at))
                     .where(other.kind == mv.kind, other.scope == mv.scope,
                            other.status == ModelStatus.RETIRED)
                     .scalar_subquery())
    is_rollback_target = (mv.status == ModelStatus.RETIRED) & (mv.promoted_at == last_promoted)
    return select(mv.id).where(mv.status != ModelStatus.ACTIVE, mv.created_at < cutoff,
                               ~is_rollback_target)


def _expired_files(now: datetime) -> Select[tuple[object]]:
    """Files past expires_at, except the input file of a batch still running."""
    f = StoredFile
    batch_input = exists().where(Batch.input_file_id == f.id, Batch.status.in_(_RUNNING_BATCHES))
    return select(f.id).where(f.expires_at < now, ~batch_input)


def purge(settings: Settings, db: Database, now: datetime | None = None, *,
          max_run_s: float | None = None) -> dict[str, int]:
    """One purge run with the settings' policy (the health worker's task, `blockq purge`)."""
    report = Purge(db, file_store(settings, db), RetentionPolicy.of(settings),
                   chunk_rows=settings.purge_chunk_rows).run(now, max_run_s=max_run_s)
    if any(report.values()):
        logger.info("retention purge deleted %s", ", ".join(
            f"{count} {name}" for name, count in report.items() if count), extra=report)
    return report
