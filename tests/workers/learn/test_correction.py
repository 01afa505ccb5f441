"""The online loop's per-model correction and its acceptance test, without a database: the
correction learns a shifted, rescaled serving model from its history; the paired test promotes a
clearly better candidate and keeps a worse one."""

from __future__ import annotations

import numpy as np
import pytest

from workers.learn.correction import CorrectionConfig, fit_correction, forward_chained
from workers.learn.loop import LoopConfig, correction_turn, paired_verdict
from workers.predict.features import FEATURE_NAMES
from workers.predict.length_model import Design, LengthHead, ModelCorrection, TrainConfig, fit_head

DIM = 48


def _world(seed: int = 0):
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=DIM) / np.sqrt(DIM) * 1.5
    extra = rng.normal(size=DIM) / np.sqrt(DIM) * 0.6  # what the prompt does to the new model only
    return rng, truth, extra


def _design(x: np.ndarray, model: str | list[str]) -> Design:
    models = [model] * len(x) if isinstance(model, str) else model
    features = np.zeros((len(x), len(FEATURE_NAMES)), dtype=np.float32)
    return Design(x.astype(np.float32), features, tuple(models))


def _shared_head(seed: int = 0) -> LengthHead:
    """A head trained on two serving models that differ only by their verbosity."""
    rng, truth, _ = _world(seed)
    x = rng.normal(size=(300, DIM))
    slots = np.arange(300) % 2
    y = 5.0 + x @ truth + 0.4 * slots + rng.normal(scale=0.2, size=300)
    head, _ = fit_head(_design(x, [f"m{s}" for s in slots]), np.exp(y),
                       [f"p{i}" for i in range(300)], encoder_info={"layers": [0]},
                       config=TrainConfig(alphas=(1.0, 10.0, 100.0)))
    return head


def _new_model_rows(n: int, seed: int):
    """An unseen serving model: more verbose, stretches long answers, and reacts to prompts in
    its own way."""
    rng, truth, extra = _world(0)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, DIM))
    y = 5.6 + 1.4 * (x @ truth) + x @ extra + rng.normal(scale=0.2, size=n)
    return x, np.maximum(np.rint(np.exp(y)), 1)


def _mae(log_point: np.ndarray, tokens: np.ndarray) -> float:
    return float(np.abs(np.clip(np.rint(np.exp(log_point)), 1, 100_000) - tokens).mean())


def test_paired_verdict_keeps_a_worse_candidate_and_promotes_a_clearly_better_one() -> None:
    rng = np.random.default_rng(1)
    active = rng.gamma(2.0, 50.0, size=300)
    worse = active + rng.normal(8.0, 30.0, size=300)      # 8 tokens worse on average
    better = active - np.abs(rng.normal(15.0, 10.0, size=300))
    noise = active + rng.normal(-0.3, 30.0, size=300)     # a hair better, within the noise

    assert not paired_verdict(worse, active, min_confidence=0.8).promote
    verdict = paired_verdict(better, active, min_confidence=0.8)
    assert verdict.promote and verdict.confidence > 0.99
    assert verdict.candidate_mae < verdict.active_mae
    assert not paired_verdict(noise, active, min_confidence=0.8).promote
    assert not paired_verdict(np.array([]), np.array([]), min_confidence=0.8).promote


def test_fitted_correction_reduces_the_error_of_an_unseen_shifted_model() -> None:
    head = _shared_head()
    x, tokens = _new_model_rows(400, seed=3)
    design = _design(x, "new")
    inputs, z = head.inputs(design), head.predict_log(design)[0]
    correction, chosen = fit_correction(inputs, z, tokens, 100_000)

    # On the next prompts of that model, never seen by the correction:
    x_next, tokens_next = _new_model_rows(300, seed=4)
    next_design = _design(x_next, "new")
    before = _mae(head.predict_log(next_design)[0], tokens_next)
    corrected = head.with_correction("new", correction)
    after = _mae(corrected.predict_log(next_design)[0], tokens_next)
    assert after < 0.6 * before, (before, after, chosen)
    assert chosen["slope"] and chosen["penalty"] is not None  # scale and prompt terms earned it
    intercept_only = head.with_correction("new", ModelCorrection(
        intercept=float(np.median(np.log(tokens) - z))))
    assert after < 0.9 * _mae(intercept_only.predict_log(next_design)[0], tokens_next)
    # The other serving models are untouched.
    other = _design(x_next, "m0")
    assert np.array_equal(corrected.predict_log(other)[0], head.predict_log(other)[0])


def test_with_little_history_the_correction_is_an_intercept_shrunk_towards_zero() -> None:
    head = _shared_head()
    x, tokens = _new_model_rows(15, seed=5)
    design = _design(x, "new")
    z = head.predict_log(design)[0]
    correction, chosen = fit_correction(head.inputs(design), z, tokens, 100_000,
                                        CorrectionConfig(prior_rows=15.0))
    assert correction.weights is None and correction.slope == 0.0
    assert not chosen["slope"]
    median = float(np.median(np.log(tokens) - z))
    assert correction.intercept == pytest.approx(median * 0.5, rel=0.25)


def test_forward_chained_predictions_use_only_earlier_rows() -> None:
    head = _shared_head()
    x, tokens = _new_model_rows(100, seed=6)
    design = _design(x, "new")
    inputs, z = head.inputs(design), head.predict_log(design)[0]
    config = CorrectionConfig(num_blocks=5, min_block_rows=10)
    oof = forward_chained(inputs, z, tokens, 100_000, config)
    assert np.isnan(oof[:20]).all() and np.isfinite(oof[20:]).all()
    # Changing the last rows' answers changes no prediction of an earlier row.
    changed = tokens.copy()
    changed[80:] *= 5
    again = forward_chained(inputs, z, changed, 100_000, config)
    assert np.array_equal(oof[20:80], again[20:80])


def test_correction_turn_promotes_on_an_unseen_model_and_keeps_against_an_oracle() -> None:
    head = _shared_head()
    x, tokens = _new_model_rows(200, seed=7)
    design = _design(x, "new")
    caps = np.full(len(tokens), 100_000)
    active_tokens = np.array([p.tokens for p in head.predict(design, caps)])
    turn = correction_turn(head, design, tokens, caps, active_tokens, model="new",
                           config=LoopConfig())
    assert turn.verdict.promote and turn.verdict.candidate_mae < 0.8 * turn.verdict.active_mae
    assert turn.verdict.rows == 160  # every row past the first of 5 time blocks
    assert set(turn.candidate.corrections) == {"new"}

    oracle = correction_turn(head, design, tokens, caps, tokens, model="new",
                             config=LoopConfig())
    assert not oracle.verdict.promote

    # Rows an active correction was fitted on are not judged.
    seen = np.arange(200) < 150
    partial = correction_turn(turn.candidate, design, tokens, caps, active_tokens, model="new",
                              config=LoopConfig(), active_seen=seen)
    assert partial.verdict.rows == 50


def test_a_corrected_head_round_trips_and_removing_the_correction_restores_it() -> None:
    head = _shared_head()
    x, tokens = _new_model_rows(200, seed=8)
    design = _design(x, "new")
    correction, _ = fit_correction(head.inputs(design), head.predict_log(design)[0], tokens,
                                   100_000, log_q=0.7, through="2026-12-02T00:00:00")
    corrected = head.with_correction("new", correction)
    assert corrected.version != head.version
    loaded = LengthHead.from_bytes(corrected.to_bytes())
    assert loaded.version == corrected.version
    assert loaded.corrections["new"].through == "2026-12-02T00:00:00"
    assert np.allclose(loaded.predict_log(design)[0], corrected.predict_log(design)[0],
                       atol=1e-4)
    point, upper, known = loaded.predict_log(design)
    assert np.allclose(upper - point, 0.7) and not known.any()
    assert corrected.with_correction("new", None).version == head.version
    assert np.array_equal(LengthHead.from_bytes(head.to_bytes()).predict_log(design)[0],
                          head.predict_log(design)[0])
