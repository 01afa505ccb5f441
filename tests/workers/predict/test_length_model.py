"""The learned length model: training, the max_tokens cap, uncertainty, artifact, batching."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from tests.workers.synthetic_lengths import synthetic_rows
from workers.predict.dataset import split_by_prompt
from workers.predict.effects import EffectsConfig
from workers.predict.length_model import (
    BOOTSTRAP_ARTIFACT,
    LengthHead,
    LengthPredictor,
    TrainConfig,
    design_matrix,
    evaluate,
    fit_head,
    length_metrics,
    train,
)

# Small data: lighter penalties than the defaults tuned on 2,450 real rows.
CONFIG = TrainConfig(alphas=(0.3, 3.0, 30.0), num_folds=4, min_rows_per_model_quantile=10)


@pytest.fixture(scope="module")
def trained(tiny_encoder, counter) -> tuple[LengthPredictor, dict, list]:
    train_rows, test_rows = split_by_prompt(synthetic_rows(num_prompts=60), test_share=0.25)
    predictor, metrics = train(train_rows, encoder=tiny_encoder, counter=counter,
                               config=CONFIG)
    return predictor, metrics, test_rows


def test_train_reports_out_of_fold_metrics(trained) -> None:
    _, metrics, _ = trained
    assert metrics["validated"] and metrics["num_folds"] == 4
    assert metrics["alpha"] in CONFIG.alphas
    for key in ("mae_tokens", "median_rel_error", "within_25pct", "spearman", "p90_coverage"):
        assert np.isfinite(metrics[key]), key
    assert metrics["spearman"] > 0.8


def test_learns_lengths_and_beats_the_mean_on_held_out_prompts(trained) -> None:
    predictor, _, test_rows = trained
    held_out = evaluate(predictor, test_rows)
    actual = np.array([r.output_tokens for r in test_rows])
    mean_only = length_metrics(np.full(len(actual), actual.mean()), actual)
    assert held_out["mae_tokens"] < 0.5 * mean_only["mae_tokens"]
    assert held_out["spearman"] > 0.8
    # The serving model matters: the verbose model gets the longer prediction.
    small, big = predictor.predict_batch(["Describe owls in 200 words."] * 2,
                                         ["small-model", "big-model"], 4096)
    assert big.tokens > 1.8 * small.tokens


def test_prediction_never_exceeds_max_tokens(trained) -> None:
    predictor, _, _ = trained
    prompts = ["Write a detailed essay about glaciers, in 2000 words.", "One word: yes or no?"]
    for cap in (1, 5, 50, 100_000):
        for p in predictor.predict_batch(prompts, "big-model", cap):
            assert 1 <= p.tokens <= p.p90_tokens <= cap
    per_request = predictor.predict_batch(prompts, ["big-model", "small-model"], [7, 3])
    assert per_request[0].tokens <= 7 and per_request[1].p90_tokens <= 3
    with pytest.raises(ValueError):
        predictor.predict_batch(prompts, "big-model", 0)
    with pytest.raises(ValueError):
        predictor.predict_batch(prompts, "big-model", [10])


def test_uncertainty_and_unknown_models(trained) -> None:
    predictor, _, _ = trained
    known = predictor.predict("Write a detailed essay about owls.", "big-model", 10_000)
    unknown = predictor.predict("Write a detailed essay about owls.", "never-seen", 10_000)
    assert known.model_known and not unknown.model_known
    assert known.p90_tokens > known.tokens
    small = predictor.predict("Write a detailed essay about owls.", "small-model", 10_000)
    assert small.tokens < unknown.tokens < known.tokens  # the pooled model sits in between


def test_batch_and_single_predictions_agree(trained) -> None:
    predictor, _, test_rows = trained
    prompts = [r.prompt for r in test_rows[:12]] + [
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
         {"role": "user", "content": "Describe tea in 100 words."}]]
    models = ["big-model", "small-model", "other"] * 4 + ["big-model"]
    batch = predictor.predict_batch(prompts, models, 2048)
    single = [predictor.predict(p, m, 2048) for p, m in zip(prompts, models, strict=True)]
    for b, s in zip(batch, single, strict=True):
        assert abs(b.tokens - s.tokens) <= max(1, 0.002 * s.tokens)
        assert abs(b.p90_tokens - s.p90_tokens) <= max(1, 0.002 * s.p90_tokens)
        assert b.model_known == s.model_known
    assert predictor.predict_batch([], "big-model", 10) == []


def test_artifact_round_trip(trained, tmp_path: Path, tiny_encoder_dir: Path) -> None:
    predictor, metrics, test_rows = trained
    path = predictor.head.save(tmp_path / "length.npz")
    assert path.stat().st_size < 100_000 and path.with_suffix(".json").exists()
    head = LengthHead.load(path)
    assert head.version == predictor.head.version and head.metrics == pytest.approx(metrics)
    assert head.model_names == predictor.head.model_names
    assert LengthHead.from_bytes(predictor.head.to_bytes()).version == head.version
    prompts = [r.prompt for r in test_rows[:8]]
    before = predictor.predict_batch(prompts, "big-model", 4096)
    assert predictor.with_head(head).predict_batch(prompts, "big-model", 4096) == before
    # A full load rebuilds the same encoder from the settings the artifact records.
    reloaded = LengthPredictor.load(path, encoder_path=str(tiny_encoder_dir), dtype="float32")
    assert reloaded.predict_batch(prompts, "big-model", 4096) == before
    assert reloaded.name == predictor.name == f"length_model:{head.version}"
    with pytest.raises(ValueError, match="encoder_path"):
        LengthPredictor.load(path)  # trained on the tiny encoder, not the packaged default


def test_artifact_with_other_features_is_refused(trained) -> None:
    predictor, _, _ = trained
    with pytest.raises(ValueError, match="features"):
        dataclasses.replace(predictor.head, feature_names=("a", "b"))


def test_train_accepts_history_rows_and_refuses_nonsense(tiny_encoder, counter) -> None:
    rows = [{"prompt": f"Describe tea in {n} words.", "model": "m", "output_tokens": n}
            for n in (10, 20, 40, 80, 160, 320)]
    rows.append({"prompt": "ignored", "model": "m", "output_tokens": 0})  # no answer: skipped
    predictor, metrics = train(rows, encoder=tiny_encoder, counter=counter, config=CONFIG)
    assert metrics["num_rows"] == 6 and metrics["num_prompts"] == 6
    assert predictor.predict("Describe tea in 40 words.", "m", 4096).model_known
    design = design_matrix(["a", "b"], ["m", "m"], encoder=tiny_encoder, counter=counter)
    with pytest.raises(ValueError):
        fit_head(design, [5], ["g", "h"], encoder_info={})  # one length for two rows
    with pytest.raises(ValueError):
        fit_head(design, [5, 0], ["g", "h"], encoder_info={})  # a zero-token answer


def test_metrics() -> None:
    m = length_metrics(np.array([100, 200, 300]), np.array([100, 250, 200]),
                       p90=np.array([150, 240, 400]))
    assert m["mae_tokens"] == pytest.approx(50.0)
    assert m["median_rel_error"] == pytest.approx(0.2)
    assert m["within_25pct"] == pytest.approx(2 / 3)
    assert m["spearman"] == pytest.approx(0.5)
    assert m["p90_coverage"] == pytest.approx(2 / 3)


def test_shipped_bootstrap_artifact_predicts() -> None:
    """Smoke test: the artifact in the package loads with the packaged MiniLM and predicts."""
    assert BOOTSTRAP_ARTIFACT.exists() and BOOTSTRAP_ARTIFACT.stat().st_size < 5 * 2**20
    predictor = LengthPredictor.load()
    assert predictor.head.metrics["num_rows"] > 1000
    short, long = predictor.predict_batch(
        ["Answer with one word: is water wet?",
         "Write a detailed, comprehensive guide to building a web app in Python with code."],
        "gpt-4-0613", 4096)
    assert 1 <= short.tokens < long.tokens <= 4096
    assert predictor.predict("Hello", "some-new-model", 16).tokens <= 16


def test_neighbours_travel_with_the_artifact(tiny_encoder, counter, tmp_path: Path) -> None:
    """A head whose prompt effect borrows from its training prompts' neighbours predicts the
    same after a save and load (anchors stored as float16), and a training prompt is pulled
    towards its own effect."""
    rows = synthetic_rows(num_prompts=40)
    config = dataclasses.replace(CONFIG, effects=EffectsConfig(neighbour_shares=(0.5,)))
    predictor, metrics = train(rows, encoder=tiny_encoder, counter=counter, config=config)
    head = predictor.head
    assert metrics["neighbour_share"] == 0.5 and head.neighbours == 20
    assert head.neighbour_embeddings is not None
    assert head.neighbour_embeddings.shape == (40, tiny_encoder.dim)
    assert head.neighbour_effects is not None and len(head.neighbour_effects) == 40
    prompts = [r.prompt for r in rows[:12]]
    before = predictor.predict_batch(prompts, "big-model", 4096)
    loaded = LengthHead.load(head.save(tmp_path / "length.npz"))
    assert loaded.neighbour_embeddings is not None and loaded.neighbours == head.neighbours
    assert predictor.with_head(loaded).predict_batch(prompts, "big-model", 4096) == before
    # Without the neighbours' part the points move: it is applied.
    plain = dataclasses.replace(loaded, neighbour_embeddings=None, neighbour_effects=None)
    assert predictor.with_head(plain).predict_batch(prompts, "big-model", 4096) != before


def test_distinct_rows_are_found_once_and_map_back() -> None:
    """A batch repeats a prompt once per serving model: its neighbours are looked up once."""
    from workers.predict.length_model import _distinct_rows

    rng = np.random.default_rng(0)
    prompts = rng.normal(size=(3, 2304)).astype(np.float32)
    batch = prompts[[2, 0, 2, 1, 0, 2]]
    distinct, rows = _distinct_rows(batch)
    assert len(distinct) == 3 and rows.shape == (6,)
    np.testing.assert_array_equal(distinct[rows], batch)
