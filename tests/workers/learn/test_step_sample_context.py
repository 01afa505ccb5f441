"""Step samples' context features through the database: the sink writes them, the learning
loop's history reads them back, and a refit prices long contexts with them."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import numpy as np
import pytest

from domain.db import Database
from domain.models import EngineStepSample, utcnow
from domain.settings import Settings
from workers.learn import history
from workers.learn.loop import LoopConfig, refit_exec_model
from workers.serve.engine import StepSample
from workers.serve.step_samples import StepSampleSink
from workers.sim import BatchStats, bundled_model, fit_from_step_samples
from workers.sim.exec_model import CONTEXT_KEYS, evaluate_on_step_samples

INSTANCE = "gpu.0"


@pytest.fixture
def db(fresh_services: Settings) -> Iterator[Database]:
    database = Database(fresh_services.resolved_database_url)
    yield database
    database.dispose()


def _steps(num: int, seed: int) -> list[StepSample]:
    """Steps of the Llama-2 A30 model with long contexts (the context terms matter)."""
    truth = bundled_model("llama-2-7b-a30")
    rng = np.random.default_rng(seed)
    steps = []
    for i in range(num):
        chunks = [(1, int(n) - 1, int(n)) for n in rng.integers(100, 4000, rng.integers(1, 48))]
        if rng.random() < 0.5:
            new = int(rng.integers(16, 400))
            chunks.append((new, int(rng.integers(0, 3000)), 4096))
        stats = BatchStats.of_chunks(chunks)
        steps.append(StepSample(
            at=1_000_000.0 + i / 1000, duration_ms=truth.step_ms(stats) * rng.lognormal(0, 0.02),
            num_seqs=stats.num_seqs, num_prefill_tokens=stats.num_prefill_tokens,
            num_decode_tokens=stats.num_decode_seqs, num_running=0, num_waiting=0,
            kv_cache_usage=0.5, decode_context_tokens=stats.decode_context_tokens,
            prefill_chunk_x_context=stats.prefill_chunk_x_context,
            prefill_chunk_sq=stats.prefill_chunk_sq))
    return steps


def test_the_sink_writes_and_history_reads_the_context_features(db: Database) -> None:
    steps = _steps(20, seed=1)
    sink = StepSampleSink(INSTANCE, db, interval_s=60)
    for step in steps:
        sink.add(step)
    sink.flush()
    with db.session() as session:  # a row written without them (before the migration)
        session.add(EngineStepSample(
            instance_id=INSTANCE, at=utcnow() + timedelta(days=1), duration_ms=1.0, num_seqs=1,
            num_prefill_tokens=0, num_decode_tokens=1, num_running=1, num_waiting=0,
            kv_cache_usage=0.1))

    with db.session() as session:
        read = history.step_samples(session, INSTANCE, limit=100)

    assert [[row[k] for k in CONTEXT_KEYS] for row in read[:-1]] == [
        [s.decode_context_tokens, s.prefill_chunk_x_context, s.prefill_chunk_sq] for s in steps]
    assert any(row["prefill_chunk_x_context"] for row in read)
    assert [read[-1][k] for k in CONTEXT_KEYS] == [0, 0, 0]


def test_a_refit_from_recorded_steps_prices_long_contexts(db: Database) -> None:
    sink = StepSampleSink(INSTANCE, db, interval_s=60)
    for step in _steps(400, seed=2):
        sink.add(step)
    sink.flush()

    report = refit_exec_model(db, bundled_model("qwen2-7b-a30"), instance_id=INSTANCE,
                              config=LoopConfig(min_rows=50))

    assert report.outcome == "promoted", report
    assert report.candidate["mape"] < 0.05, report
    # The same steps without their context cannot be fitted as well: the features matter.
    with db.session() as session:
        samples = history.step_samples(session, INSTANCE, limit=1000)
    blind = [{k: v for k, v in s.items() if k not in CONTEXT_KEYS} for s in samples]
    blind_fit = fit_from_step_samples(blind[:320])
    assert evaluate_on_step_samples(blind_fit, blind[320:])["mape"] > 2 * report.candidate["mape"]
