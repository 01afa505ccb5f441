"""The retention purge on PostgreSQL: rows on both sides of every cutoff, work in flight kept,
chunked and safe beside another purge, from the health worker's task and from `blockq purge`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from app.cli import main
from domain.celery_app import create_celery
from domain.db import Database
from domain.dispatch import TASK_PURGE
from domain.file_bytes import file_store
from domain.models import (
    Batch,
    BatchLine,
    BatchStatus,
    EngineStepSample,
    InferenceRequest,
    ModelStatus,
    ModelVersion,
    RequestEvent,
    RequestOutcome,
    StoredFile,
    Team,
    WebhookDelivery,
    utcnow,
)
from domain.retention import Purge, RetentionPolicy, purge
from domain.settings import Settings

pytestmark = pytest.mark.services

NOW = utcnow()


def ago(days: float = 0, **delta: float) -> datetime:
    return NOW - timedelta(days=days, **delta)


@pytest.fixture
def settings(fresh_services: Settings) -> Settings:
    return fresh_services.model_copy(update={
        "retain_requests_days": 30, "retain_outcomes_days": 90, "retain_step_samples_days": 7,
        "retain_webhook_deliveries_days": 30, "retain_batches_days": 30,
        "retain_model_versions_days": 90, "purge_chunk_rows": 2})


@pytest.fixture
def db(settings: Settings) -> Iterator[Database]:
    database = Database(settings.resolved_database_url)
    with database.session() as session:
        session.add(Team(id="team_a", name="a"))
    yield database
    database.dispose()


# --- rows ----------------------------------------------------------------------------------------
def add_request(db: Database, request_id: str, *, status: str = "succeeded", updated: datetime,
                batch_id: str | None = None, events: int = 2) -> None:
    with db.session() as session:
        session.add(InferenceRequest(
            id=request_id, team_id="team_a", status=status, priority="interactive",
            prompt=f"secret prompt of {request_id}", max_tokens=8, temperature=1.0, top_p=1.0,
            body_sha256="0" * 64, prompt_tokens=4, output_text="secret output",
            batch_id=batch_id, created_at=updated, updated_at=updated))
        session.flush()
        for _ in range(events):
            session.add(RequestEvent(request_id=request_id, status=status, at=updated))


def add_delivery(db: Database, request_id: str, at: datetime) -> None:
    with db.session() as session:
        session.add(WebhookDelivery(request_id=request_id, event_id="evt", event_type="t",
                                    url="http://127.0.0.1:9/", attempt=1, succeeded=True,
                                    duration_ms=1.0, at=at))


def add_outcome(db: Database, request_id: str, finished: datetime) -> None:
    with db.session() as session:
        session.add(RequestOutcome(
            request_id=request_id, finished_at=finished, model_name="m", instance_id="gpu.0",
            prompt="secret prompt", features={}, prompt_tokens=4, max_tokens=8,
            output_tokens=3, e2e_s=1.0))


def add_samples(db: Database, at: datetime, count: int) -> None:
    with db.session() as session:
        session.add_all(EngineStepSample(
            instance_id="gpu.0", at=at, duration_ms=1.0, num_seqs=1, num_prefill_tokens=0,
            num_decode_tokens=1, num_running=1, num_waiting=0, kv_cache_usage=0.1)
            for _ in range(count))


def add_batch(db: Database, batch_id: str, *, status: str, updated: datetime,
              input_file_id: str = "file-none", lines: int = 0) -> None:
    with db.session() as session:
        session.add(Batch(id=batch_id, team_id="team_a", status=status, endpoint="/v1/completions",
                          input_file_id=input_file_id, completion_window="24h",
                          created_at=updated, updated_at=updated, expires_at=updated))
        session.flush()
        session.add_all(BatchLine(batch_id=batch_id, line=n, status="released",
                                  request_id=f"req_{batch_id}_{n}") for n in range(1, lines + 1))


def add_version(db: Database, version: int, *, status: str, created: datetime,
                promoted: datetime | None = None) -> int:
    with db.session() as session:
        row = ModelVersion(kind="length", scope="m", version=version, status=status,
                           training_rows=1, metrics={}, artifact=b"x" * 100, created_at=created,
                           promoted_at=promoted)
        session.add(row)
        session.flush()
        return row.id


def add_file(db: Database, settings: Settings, file_id: str, *,
             expires: datetime | None) -> None:
    store = file_store(settings)
    with store.writer(file_id) as handle:
        handle.write(b"secret bytes\n")
    with db.session() as session:
        session.add(StoredFile(id=file_id, team_id="team_a", purpose="batch", filename="f.jsonl",
                               size_bytes=13, created_at=ago(1), expires_at=expires))


def ids(db: Database, column: Any) -> set[Any]:
    with db.session() as session:
        return set(session.scalars(select(column)))


def count(db: Database, model: Any) -> int:
    with db.session() as session:
        return session.scalar(select(func.count()).select_from(model)) or 0


# --- the tests -----------------------------------------------------------------------------------
def test_purge_deletes_only_what_is_past_each_cutoff_and_never_work_in_flight(
        settings: Settings, db: Database) -> None:
    add_request(db, "req_old", updated=ago(31))  # finished 31 days ago: goes
    add_delivery(db, "req_old", ago(1))  # a fresh delivery goes with its request
    add_request(db, "req_recent", updated=ago(29))  # 29 days: kept
    add_delivery(db, "req_recent", ago(31))  # an old delivery of a kept request: goes
    add_delivery(db, "req_recent", ago(29))
    for status in ("queued", "predicting", "routed", "running"):  # in flight, however old
        add_request(db, f"req_{status}", status=status, updated=ago(365))
    add_batch(db, "batch_running", status=BatchStatus.IN_PROGRESS, updated=ago(60),
              input_file_id="file-input-running", lines=2)
    add_request(db, "req_of_running_batch", updated=ago(60), batch_id="batch_running")
    add_batch(db, "batch_done", status=BatchStatus.COMPLETED, updated=ago(60))
    add_request(db, "req_of_done_batch", updated=ago(60), batch_id="batch_done")
    add_batch(db, "batch_done_recent", status=BatchStatus.CANCELLED, updated=ago(29))
    add_batch(db, "batch_done_with_request", status=BatchStatus.FAILED, updated=ago(60))
    add_request(db, "req_recent_of_old_batch", updated=ago(1), batch_id="batch_done_with_request")

    add_outcome(db, "req_outcome_old", ago(91))
    add_outcome(db, "req_outcome_recent", ago(89))
    add_samples(db, ago(8), 5)
    add_samples(db, ago(6), 3)

    active = add_version(db, 1, status=ModelStatus.ACTIVE, created=ago(400), promoted=ago(100))
    rollback_target = add_version(db, 2, status=ModelStatus.RETIRED, created=ago(300),
                                  promoted=ago(200))
    add_version(db, 3, status=ModelStatus.RETIRED, created=ago(350), promoted=ago(300))
    add_version(db, 4, status=ModelStatus.CANDIDATE, created=ago(91))
    fresh_candidate = add_version(db, 5, status=ModelStatus.CANDIDATE, created=ago(89))

    add_file(db, settings, "file-expired", expires=ago(seconds=1))
    add_file(db, settings, "file-input-running", expires=ago(1))  # a running batch reads it
    add_file(db, settings, "file-not-yet", expires=NOW + timedelta(hours=1))
    add_file(db, settings, "file-forever", expires=None)

    report = purge(settings, db, NOW)

    assert report == {"requests": 2, "request_outcomes": 1, "engine_step_samples": 5,
                      "webhook_deliveries": 1, "batches": 1, "model_versions": 2, "files": 1}
    assert ids(db, InferenceRequest.id) == {
        "req_recent", "req_queued", "req_predicting", "req_routed", "req_running",
        "req_of_running_batch", "req_recent_of_old_batch"}
    with db.session() as session:  # events and deliveries went with their requests
        assert set(session.scalars(select(RequestEvent.request_id).distinct())) == ids(
            db, InferenceRequest.id)
        kept = session.scalars(select(WebhookDelivery)).all()
        assert [(d.request_id, d.at > ago(30)) for d in kept] == [("req_recent", True)]
    assert ids(db, RequestOutcome.request_id) == {"req_outcome_recent"}
    assert count(db, EngineStepSample) == 3
    assert ids(db, Batch.id) == {"batch_running", "batch_done_recent", "batch_done_with_request"}
    assert count(db, BatchLine) == 2  # the running batch's lines
    assert ids(db, ModelVersion.id) == {active, rollback_target, fresh_candidate}
    assert ids(db, StoredFile.id) == {"file-input-running", "file-not-yet", "file-forever"}
    files_dir = settings.resolved_files_dir
    assert not (files_dir / "file-expired").exists()
    assert all((files_dir / f).exists() for f in ("file-input-running", "file-not-yet",
                                                   "file-forever"))

    # Idempotent: a second run finds nothing more to delete.
    assert set(purge(settings, db, NOW).values()) == {0}


def test_zero_days_keeps_a_table_forever(settings: Settings, db: Database) -> None:
    add_request(db, "req_ancient", updated=ago(3650))
    add_samples(db, ago(3650), 2)
    forever = settings.model_copy(update={"retain_requests_days": 0,
                                          "retain_step_samples_days": 0})
    report = purge(forever, db, NOW)
    assert "requests" not in report and "engine_step_samples" not in report
    assert ids(db, InferenceRequest.id) == {"req_ancient"} and count(db, EngineStepSample) == 2


def test_a_row_another_transaction_holds_is_skipped_not_waited_for(
        settings: Settings, db: Database) -> None:
    """SKIP LOCKED: the purge never blocks on (nor blocks) a transaction working on a row."""
    add_request(db, "req_held", updated=ago(40))
    add_request(db, "req_free", updated=ago(40))
    with db.session() as holder:
        holder.execute(select(InferenceRequest).where(InferenceRequest.id == "req_held")
                       .with_for_update())
        done: dict[str, int] = {}
        worker = threading.Thread(target=lambda: done.update(purge(settings, db, NOW)))
        worker.start()
        worker.join(timeout=20)
        assert not worker.is_alive(), "the purge waited for a lock"
    assert done["requests"] == 1
    assert ids(db, InferenceRequest.id) == {"req_held"}
    assert purge(settings, db, NOW)["requests"] == 1  # released: the next run takes it
    assert count(db, InferenceRequest) == 0


def test_two_purges_at_once_delete_every_row_exactly_once(settings: Settings,
                                                          db: Database) -> None:
    add_samples(db, ago(30), 400)
    for n in range(60):
        add_request(db, f"req_{n}", updated=ago(40), events=3)
    policy = RetentionPolicy.of(settings)
    start = threading.Barrier(2)
    reports: list[dict[str, int]] = []
    errors: list[BaseException] = []

    def run() -> None:
        other = Database(settings.resolved_database_url)
        try:
            start.wait()
            reports.append(Purge(other, file_store(settings), policy, chunk_rows=7).run(NOW))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            other.dispose()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert sum(r["engine_step_samples"] for r in reports) == 400
    assert sum(r["requests"] for r in reports) == 60
    assert count(db, EngineStepSample) == 0 and count(db, InferenceRequest) == 0
    assert count(db, RequestEvent) == 0


def test_a_bounded_run_stops_between_chunks_and_the_next_goes_on(settings: Settings,
                                                                  db: Database) -> None:
    add_samples(db, ago(8), 10)
    first = purge(settings, db, NOW, max_run_s=0)
    assert first["engine_step_samples"] <= settings.purge_chunk_rows
    assert count(db, EngineStepSample) >= 10 - settings.purge_chunk_rows
    purge(settings, db, NOW)
    assert count(db, EngineStepSample) == 0


def test_the_health_worker_runs_it_on_the_beat_schedule(settings: Settings, db: Database) -> None:
    from workers import runtime
    from workers.health import tasks

    schedule = create_celery(settings, set_as_current=False).conf.beat_schedule
    assert schedule["retention-purge"]["task"] == TASK_PURGE
    assert schedule["retention-purge"]["schedule"] == settings.purge_interval_s
    off = create_celery(settings.model_copy(update={"purge_interval_s": 0}),
                        set_as_current=False).conf.beat_schedule
    assert "retention-purge" not in off

    add_samples(db, ago(8), 3)
    runtime.configure(settings)
    try:
        assert tasks.purge.run()["engine_step_samples"] == 3
    finally:
        runtime.get().db.dispose()
    assert count(db, EngineStepSample) == 0


def test_blockq_purge_runs_it_once(settings: Settings, db: Database,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    add_samples(db, ago(8), 4)
    add_samples(db, ago(1), 1)
    for name, value in {"DATABASE_URL": settings.resolved_database_url,
                        "REDIS_URL": settings.redis_url,
                        "BLOCKQ_DATA_DIR": str(settings.data_dir)}.items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(main, ["purge"])
    assert result.exit_code == 0, result.output
    assert "engine_step_samples: 4 deleted" in result.output
    assert count(db, EngineStepSample) == 1
