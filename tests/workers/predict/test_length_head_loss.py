"""The length head's losses: the absolute-error fit, and the exact low-rank shortcut of the fit."""

from __future__ import annotations

import numpy as np
import pytest

from workers.predict.features import FEATURE_NAMES
from workers.predict.length_model import (
    Design,
    TrainConfig,
    _fit_path,
    _row_basis,
    fit_head,
)


def _data(num_prompts: int = 40, answers: int = 3, dim: int = 64, seed: int = 0):
    """Rows that repeat prompts (fewer distinct prompts than dimensions), 2 models, outliers."""
    rng = np.random.default_rng(seed)
    prompts = rng.normal(size=(num_prompts, dim))
    index = np.repeat(np.arange(num_prompts), answers)
    x = prompts[index]
    slots = np.tile(np.arange(answers) % 2, num_prompts)
    truth = rng.normal(size=dim) / np.sqrt(dim)
    y = 5.0 + x @ truth + 0.7 * slots + rng.normal(scale=0.1, size=len(index))
    y[rng.random(len(y)) < 0.15] += 3.0  # a few very long answers
    return x, y, slots, index


def test_fitting_in_the_row_basis_gives_the_same_predictions() -> None:
    x, y, slots, _ = _data()
    basis = _row_basis(x)
    assert basis is not None and basis.shape == (64, 40)
    assert np.allclose(basis.T @ basis, np.eye(40))
    for loss in ("squared", "absolute"):
        config = TrainConfig(loss=loss)
        full = _fit_path(x, y, slots, 2, [1.0, 30.0], config)
        small = _fit_path(x @ basis, y, slots, 2, [1.0, 30.0], config)
        for (w_full, b_full), (w_small, b_small) in zip(full, small, strict=True):
            assert np.allclose(x @ w_full + b_full[slots], x @ basis @ w_small + b_small[slots],
                               atol=1e-6)
            assert np.allclose(w_full, basis @ w_small, atol=1e-6)
    assert _row_basis(np.eye(5)) is None  # as many distinct rows as dimensions: no shortcut


def test_absolute_loss_fits_the_median_not_the_mean() -> None:
    x, y, slots, _ = _data(dim=8)
    (w_sq, b_sq), = _fit_path(x, y, slots, 2, [3.0], TrainConfig(loss="squared"))
    (w_abs, b_abs), = _fit_path(x, y, slots, 2, [3.0], TrainConfig(loss="absolute",
                                                                    irls_iterations=5))
    abs_squared = np.abs(y - x @ w_sq - b_sq[slots])
    abs_absolute = np.abs(y - x @ w_abs - b_abs[slots])
    assert abs_absolute.sum() < 0.9 * abs_squared.sum()
    # The outliers pull the mean fit up; the median fit stays with the bulk of the answers.
    assert np.median(y - x @ w_abs - b_abs[slots]) == pytest.approx(0.0, abs=0.05)
    assert np.median(y - x @ w_sq - b_sq[slots]) < -0.2


def test_fit_head_with_either_loss_predicts_from_full_embeddings() -> None:
    x, y, slots, index = _data()
    features = np.zeros((len(y), len(FEATURE_NAMES)), dtype=np.float32)
    design = Design(x.astype(np.float32), features, tuple(f"m{s}" for s in slots))
    groups = [f"p{i}" for i in index]
    heads = {}
    for loss in ("squared", "absolute"):
        head, metrics = fit_head(design, np.exp(y), groups, encoder_info={"layers": [0]},
                                 config=TrainConfig(loss=loss, alphas=(0.3, 3.0, 30.0)))
        assert head.weights.shape == (64 + len(FEATURE_NAMES),)
        log_point, _, known = head.predict_log(design)
        assert known.all() and np.corrcoef(log_point, y)[0, 1] > 0.5
        heads[loss] = metrics["mae_tokens"]
    assert heads["absolute"] < heads["squared"]


def test_train_config_rejects_unknown_losses() -> None:
    with pytest.raises(ValueError, match="loss"):
        TrainConfig(loss="huber")
    with pytest.raises(ValueError, match="irls"):
        TrainConfig(irls_iterations=-1)
