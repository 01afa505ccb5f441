"""The online loop against the real PostgreSQL: history -> candidate -> held-out comparison ->
registry (promote only a better model, roll back), and hot reload of the active version."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from domain import model_registry as registry
from domain.db import Database
from domain.models import EngineStepSample, ModelStatus, RequestOutcome, utcnow
from domain.settings import Settings
from tests.workers.synthetic_lengths import synthetic_rows
from workers.active_model import ActiveModel
from workers.learn.loop import LoopConfig, refit_exec_model, retrain_length_model
from workers.predict.dataset import write_rows
from workers.predict.encoder import Encoder
from workers.predict.features import TokenCounter
from workers.predict.length_model import LengthHead, LengthPrediction, train
from workers.route.stage import exec_models
from workers.runtime import Runtime
from workers.sim import BatchStats, bundled_model, step_sample

SERVED = "tiny-llama"


@pytest.fixture
def db(fresh_services: Settings) -> Iterator[Database]:
    database = Database(fresh_services.resolved_database_url)
    yield database
    database.dispose()


def _write_history(db: Database, rows: Sequence[dict]) -> None:
    start = utcnow() - timedelta(hours=1)
    with db.session() as session:
        for i, row in enumerate(rows):
            session.add(RequestOutcome(
                request_id=f"req_{i:05d}", finished_at=start + timedelta(seconds=i),
                model_name=SERVED, instance_id="gpu.0", policy="block", predictor="x",
                prompt=row["prompt"], messages=None, features={}, prompt_tokens=10,
                max_tokens=4096, predicted_output_tokens=100, predicted_output_tokens_p90=200,
                output_tokens=row["output_tokens"], finish_reason="stop", predicted_ttft_s=0.1,
                ttft_s=0.1, predicted_e2e_s=1.0, e2e_s=1.0))


def _served_history() -> list[dict]:
    """The terse fixture model's answers, now served under our model's name, shuffled in time."""
    rows = [{"prompt": r.prompt, "output_tokens": r.output_tokens}
            for r in synthetic_rows(96, seed=1) if r.model == "small-model"]
    random.Random(0).shuffle(rows)
    return rows


class OraclePredictor:
    """A stand-in active model that is never wrong: no candidate can beat it. Its `head` is what
    a "correction" candidate corrects."""

    name = "oracle"

    def __init__(self, truth: dict[str, int], head: LengthHead, encoder: Encoder,
                 counter: TokenCounter) -> None:
        self.truth, self.head, self.encoder, self.counter = truth, head, encoder, counter

    def predict_batch(self, prompts, models, max_tokens) -> list[LengthPrediction]:  # noqa: ANN001
        return [LengthPrediction(self.truth[p], self.truth[p], True) for p in prompts]


def test_retrain_promotes_a_better_model_and_keeps_a_worse_one(
    db: Database, tiny_encoder: Encoder, counter: TokenCounter
) -> None:
    # The active model learned a verbose model's answers; the served model is terse.
    verbose = [r for r in synthetic_rows(48, seed=2) if r.model == "big-model"]
    active, _ = train(verbose, encoder=tiny_encoder, counter=counter)
    history = _served_history()
    _write_history(db, history)
    config = LoopConfig(min_rows=20)

    report = retrain_length_model(db, active, model_name=SERVED, config=config)

    assert report.outcome == "promoted", report
    assert report.candidate["mae_tokens"] < report.active["mae_tokens"]
    assert report.confidence is not None and report.confidence >= config.min_confidence
    # Judged on every row past the first of the 5 time blocks, each predicted from older rows.
    assert report.holdout_rows == len(history) - len(np.array_split(history, 5)[0])
    with db.session() as session:
        promoted = registry.active(session, registry.KIND_LENGTH, SERVED)
        assert promoted is not None and promoted.version == 1
        assert promoted.metrics["candidate"]["mae_tokens"] == report.candidate["mae_tokens"]
        head = LengthHead.from_bytes(promoted.artifact)
    # The shared head is kept; the served model gets its own correction on top of it.
    assert head.model_names == active.head.model_names
    assert set(head.corrections) == {SERVED}
    assert head.corrections[SERVED].rows == len(history)

    oracle = OraclePredictor({r["prompt"]: r["output_tokens"] for r in history}, active.head,
                             tiny_encoder, counter)
    report = retrain_length_model(
        db, oracle, model_name=SERVED, config=config)  # type: ignore[arg-type]

    assert report.outcome == "kept" and report.version == 2
    with db.session() as session:
        statuses = {v.version: v.status for v in registry.versions(session, "length", SERVED)}
    assert statuses == {1: ModelStatus.ACTIVE, 2: ModelStatus.CANDIDATE}


def test_a_second_turn_judges_only_rows_the_active_correction_did_not_see(
    db: Database, tiny_encoder: Encoder, counter: TokenCounter
) -> None:
    verbose = [r for r in synthetic_rows(48, seed=2) if r.model == "big-model"]
    active, _ = train(verbose, encoder=tiny_encoder, counter=counter)
    history = _served_history()
    _write_history(db, history[:60])
    first = retrain_length_model(db, active, model_name=SERVED, config=LoopConfig(min_rows=20))
    assert first.outcome == "promoted", first
    with db.session() as session:
        corrected = active.with_head(LengthHead.from_bytes(
            registry.active(session, "length", SERVED).artifact))
    with db.session() as session:  # more requests finish after the first turn
        start = utcnow()
        for i, row in enumerate(history[60:]):
            session.add(RequestOutcome(
                request_id=f"late_{i:05d}", finished_at=start + timedelta(seconds=i),
                model_name=SERVED, instance_id="gpu.0", policy="block", predictor="x",
                prompt=row["prompt"], messages=None, features={}, prompt_tokens=10,
                max_tokens=4096, predicted_output_tokens=100, predicted_output_tokens_p90=200,
                output_tokens=row["output_tokens"], finish_reason="stop", predicted_ttft_s=0.1,
                ttft_s=0.1, predicted_e2e_s=1.0, e2e_s=1.0))

    second = retrain_length_model(db, corrected, model_name=SERVED,
                                  config=LoopConfig(min_rows=20))
    assert second.holdout_rows == len(history) - 60


def test_retrain_with_bootstrap_rows_gives_an_unseen_serving_model_its_own_intercept(
    db: Database, tiny_encoder: Encoder, counter: TokenCounter, tmp_path: Path
) -> None:
    # The bootstrap knew only a verbose model, with four times more rows than the history: the
    # served (terse) model is unknown to the active head, gets its own intercept in the
    # candidate, and that intercept is learned from the history, not drowned by the bootstrap.
    verbose = [r for r in synthetic_rows(200, seed=2) if r.model == "big-model"]
    bootstrap = tmp_path / "bootstrap.jsonl"
    write_rows(bootstrap, verbose)
    active, _ = train(verbose, encoder=tiny_encoder, counter=counter)
    history = _served_history()
    _write_history(db, history)

    report = retrain_length_model(db, active, model_name=SERVED, config=LoopConfig(
        min_rows=20, holdout_share=0.25, bootstrap_rows=bootstrap, method="refit"))

    assert report.outcome == "promoted", report
    assert report.training_rows == len(verbose) + len(history) - report.holdout_rows
    with db.session() as session:
        head = LengthHead.from_bytes(registry.active(session, "length", SERVED).artifact)
    assert head.model_names == ("big-model", SERVED)
    # small-model writes 0.6 / 1.5 of big-model: log ratio -0.92
    gap = head.model_intercepts[1] - head.model_intercepts[0]
    assert -1.3 < gap < -0.5, gap
    assert report.candidate["mae_tokens"] < 0.7 * report.active["mae_tokens"]


def test_retrain_skips_with_too_little_history(
    db: Database, tiny_encoder: Encoder, counter: TokenCounter
) -> None:
    _write_history(db, _served_history()[:5])
    active, _ = train(synthetic_rows(12), encoder=tiny_encoder, counter=counter)
    report = retrain_length_model(db, active, model_name=SERVED, config=LoopConfig(min_rows=20))
    assert report.outcome == "skipped" and "5 history rows" in report.reason


def _register(db: Database, name: str, *, promote: bool) -> int:
    with db.session() as session:
        row = registry.register(session, kind="length", scope=SERVED, artifact=name.encode(),
                                training_rows=1, metrics={})
        if promote:
            registry.promote(session, row)
        return row.version


def test_rollback_restores_the_previously_promoted_version_then_the_default(
    db: Database,
) -> None:
    reloaded = ActiveModel(db, "length", SERVED, load=bytes.decode, default=lambda: "packaged",
                           interval_s=0.0)
    assert reloaded.get() == "packaged"
    _register(db, "first", promote=True)
    _register(db, "never-promoted", promote=False)
    _register(db, "second", promote=True)
    assert reloaded.get() == "second"  # hot reload: the next call sees the promotion

    with db.session() as session:
        assert registry.rollback(session, "length", SERVED).version == 1  # type: ignore[union-attr]
    assert reloaded.get() == "first"
    with db.session() as session:
        assert registry.rollback(session, "length", SERVED) is None
    assert reloaded.get() == "packaged"
    with db.session() as session, pytest.raises(LookupError):
        registry.rollback(session, "length", SERVED)
    with db.session() as session:
        statuses = [v.status for v in registry.versions(session, "length", SERVED)]
    assert statuses == [ModelStatus.RETIRED, ModelStatus.CANDIDATE, ModelStatus.RETIRED]


def test_active_model_keeps_serving_when_it_was_loaded_and_the_check_interval_has_not_passed(
    db: Database,
) -> None:
    reloaded = ActiveModel(db, "length", SERVED, load=bytes.decode, default=lambda: "packaged",
                           interval_s=3600.0)
    assert reloaded.get() == "packaged"
    _register(db, "new", promote=True)
    assert reloaded.get() == "packaged"  # checked again only after interval_s


def _steps_of(truth_name: str, num: int, seed: int) -> list[dict[str, float]]:
    truth = bundled_model(truth_name)
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(num):
        decode = int(rng.integers(0, 48))
        prefill = int(rng.integers(0, 512 - decode)) if rng.random() < 0.5 else 0
        if prefill + decode == 0:
            continue
        # NOTE: only what engines record per step (no attention-context terms).
        stats = BatchStats(num_prefill_tokens=prefill, num_decode_seqs=decode,
                           num_prefill_seqs=1 if prefill else 0)
        samples.append(step_sample(stats, truth.step_ms(stats) * float(rng.lognormal(0, 0.02))))
    return samples


def test_exec_refit_promotes_a_fit_to_the_instance_and_routers_pick_it_up(
    db: Database, fresh_services: Settings
) -> None:
    start = utcnow()
    with db.session() as session:
        for i, s in enumerate(_steps_of("llama-2-7b-a30", 400, seed=0)):
            session.add(EngineStepSample(
                instance_id="gpu.0", at=start + timedelta(milliseconds=i),
                duration_ms=s["duration_ms"],
                num_seqs=s["num_seqs"], num_prefill_tokens=s["num_prefill_tokens"],
                num_decode_tokens=s["num_decode_tokens"], num_running=0, num_waiting=0,
                kv_cache_usage=0.0))
    wrong = bundled_model("qwen2-7b-a30")

    report = refit_exec_model(db, wrong, instance_id="gpu.0", config=LoopConfig(min_rows=50))

    assert report.outcome == "promoted", report
    assert report.candidate["mape"] < 0.05 < report.active["mape"]
    rt = Runtime(fresh_services)
    models = exec_models(rt).of(["gpu.0", "gpu.1"])
    assert models["gpu.0"].name == "gpu.0-steps"
    assert models["gpu.1"].name == exec_models(rt).default.name  # no samples: the default
