"""The effects fit (model effect, prompt effect, sensitivity, interaction) and the calibration of
a new serving model from its first answers, on synthetic panels with a known truth."""

from __future__ import annotations

import random

import numpy as np
import pytest

from workers.learn.correction import CorrectionConfig, correction_config, fit_correction
from workers.learn.evaluation import FeaturesOnly
from workers.predict.dataset import LengthRow, prompt_id_of
from workers.predict.effects import (
    EffectsConfig,
    decompose,
    fit_effects,
    group_median,
    neighbour_effect,
)
from workers.predict.length_model import TrainConfig, design_matrix, train


def test_group_median_is_weighted_and_per_group() -> None:
    values = np.array([5.0, 1.0, 3.0, 10.0, 20.0, 7.0])
    groups = np.array([0, 0, 0, 2, 2, 2])
    np.testing.assert_array_equal(group_median(values, groups, 3)[[0, 2]], [3.0, 10.0])
    assert np.isnan(group_median(values, groups, 3)[1])
    weights = np.array([1.0, 1.0, 1.0, 0.0, 1.0, 5.0])
    assert group_median(values, groups, 3, weights)[2] == 7.0


def _panel(num_prompts: int = 120, seed: int = 0):
    """log y = b[m] + s[m] * a[p] + noise; model 0 ignores the prompt (one fixed text)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_prompts, 12))
    truth = rng.normal(size=12) * 0.4
    a = x @ truth
    b = np.array([5.4, 4.0, 5.0, 6.0, 5.5, 4.5])
    s = np.array([0.0, 1.0, 1.0, 1.0, 0.7, 1.3])
    prompts = np.repeat(np.arange(num_prompts), len(b))
    models = np.tile(np.arange(len(b)), num_prompts)
    noise = rng.normal(scale=0.25, size=len(prompts)) * (models != 0)
    tokens = np.maximum(np.rint(np.exp(b[models] + s[models] * a[prompts] + noise)), 1)
    return x, prompts, models, tokens, b, s


def test_decompose_recovers_sensitivities_and_flags_the_fixed_text_model() -> None:
    x, prompts, models, tokens, _, s = _panel()
    _, _, s_hat, typical = decompose(np.log(tokens), prompts, models, len(x), len(s))
    assert s_hat[0] < 0.05 and not typical[models == 0].any() and typical[models != 0].all()
    np.testing.assert_allclose(s_hat[1:], s[1:], atol=0.15)


def test_fit_effects_beats_per_model_medians_on_unseen_prompts() -> None:
    x, prompts, models, tokens, b, _ = _panel(num_prompts=200)
    train_rows = prompts < 150
    fit = fit_effects(x, prompts[train_rows], models[train_rows], tokens[train_rows], len(b),
                      EffectsConfig(alphas=(0.3, 3.0, 30.0), ranks=(0, 2)))
    assert fit.insensitive == (0,)
    test = ~train_rows
    log_pred = fit.model_effects[models[test]] + fit.sensitivities[models[test]] * (
        x[prompts[test]] @ fit.prompt_weights + fit.prompt_bias)
    ours = np.abs(np.exp(log_pred) - tokens[test]).mean()
    medians = np.array([np.median(tokens[train_rows & (models == m)]) for m in range(len(b))])
    baseline = np.abs(medians[models[test]] - tokens[test]).mean()
    assert ours < 0.6 * baseline
    # The fixed-text model is predicted as its fixed length.
    assert abs(np.exp(fit.model_effects[0]) - np.exp(5.4)) < 3


TOPICS = ("tea", "rivers", "owls", "jazz", "chess", "salt", "maps", "bees")


def _rows(model: str, factor: float, prompts: range, seed: int) -> list[LengthRow]:
    rng = random.Random(seed)
    rows = []
    for i in prompts:
        words = (10, 30, 100, 300, 1000)[i % 5]
        prompt = f"Describe {TOPICS[i % len(TOPICS)]} in {words} words. ({i})"
        tokens = max(1, round(words * 1.3 * factor * rng.uniform(0.8, 1.25)))
        rows.append(LengthRow(prompt_id_of(prompt), prompt, model, tokens))
    return rows


def test_a_new_model_is_calibrated_from_its_first_answers(counter) -> None:
    """A model 3x as verbose as any trained one: the zero-shot prior is off, 50 answers fix most
    of it and 200 at least as much (its effect shrunk towards the prior by the head's weight)."""
    known = [r for m, f in (("a", 0.5), ("b", 0.8), ("c", 1.0), ("d", 1.2))
             for r in _rows(m, f, range(80), seed=ord(m))]
    predictor, _ = train(known, encoder=FeaturesOnly(), counter=counter,
                         config=TrainConfig(alphas=(0.3, 3.0, 30.0), num_folds=4))
    head = predictor.head
    assert head.prior_rows is not None and 0 < head.prior_rows < 50
    history = _rows("new", 3.0, range(100, 400), seed=1)
    test = _rows("new", 3.0, range(400, 500), seed=2)
    actual = np.array([r.output_tokens for r in test], dtype=np.float64)
    config = correction_config(head, CorrectionConfig())
    assert config.prior_rows == head.prior_rows
    maes = {}
    for n in (0, 50, 200):
        current = predictor
        if n:
            rows = history[:n]
            design = design_matrix([r.prompt for r in rows], ["new"] * n,
                                   encoder=predictor.encoder, counter=counter)
            z = head.predict_log(design, corrected=False)[0]
            correction, _ = fit_correction(head.inputs(design), z,
                                           np.array([r.output_tokens for r in rows]), 100_000,
                                           config)
            current = predictor.with_head(head.with_correction("new", correction))
        predicted = np.array([p.tokens for p in current.predict_batch(
            [r.prompt for r in test], "new", 100_000)])
        maes[n] = np.abs(predicted - actual).mean()
    assert maes[50] < 0.5 * maes[0]
    assert maes[200] <= maes[50] * 1.05


def test_neighbour_effect_is_a_softmax_over_the_nearest_anchors() -> None:
    anchors = np.array([[1.0, 0.0], [0.0, 2.0], [-1.0, 0.0]])
    effects = np.array([1.0, 2.0, 3.0])
    queries = np.array([[3.0, 0.1], [0.0, 1.0], [1.0, 1.0]])
    sharp = neighbour_effect(queries, anchors, effects, neighbours=2, temperature=0.01)
    np.testing.assert_allclose(sharp[:2], [1.0, 2.0], atol=1e-6)
    # Equally near two anchors: their mean; the third is not among the 2 nearest.
    assert sharp[2] == pytest.approx(1.5)
    flat = neighbour_effect(queries[:1], anchors, effects, neighbours=3, temperature=1e6)
    assert flat[0] == pytest.approx(2.0)
    assert neighbour_effect(queries, anchors[:0], effects[:0], neighbours=2,
                            temperature=0.1).tolist() == [0.0, 0.0, 0.0]


def _clustered_panel(num_prompts: int = 240, seed: int = 0):
    """Prompts in 12 tight clusters whose effects are not linear in the inputs."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(12, 4))
    cluster = rng.integers(0, 12, size=num_prompts)
    x = centres[cluster] + rng.normal(scale=0.05, size=(num_prompts, 4))
    a = rng.choice([-0.8, 0.0, 0.8], size=12)[cluster]
    b = np.array([4.0, 5.0, 6.0, 5.5])
    prompts = np.repeat(np.arange(num_prompts), len(b))
    models = np.tile(np.arange(len(b)), num_prompts)
    noise = rng.normal(scale=0.2, size=len(prompts))
    tokens = np.maximum(np.rint(np.exp(b[models] + a[prompts] + noise)), 1)
    return x, prompts, models, tokens, len(b)


def _held_out_mae(fit, x, prompts, models, tokens, test, config: EffectsConfig) -> float:
    f = x @ fit.prompt_weights + fit.prompt_bias
    if fit.neighbour_share:
        f = f + neighbour_effect(x, x[fit.neighbour_prompts], fit.neighbour_effects,
                                 neighbours=config.neighbours,
                                 temperature=config.neighbour_temperature)
    log_pred = fit.model_effects[models[test]] + fit.sensitivities[models[test]] * f[
        prompts[test]]
    return float(np.abs(np.exp(log_pred) - tokens[test]).mean())


def test_neighbours_lend_a_prompt_effect_that_the_ridge_cannot_fit() -> None:
    x, prompts, models, tokens, num_models = _clustered_panel()
    train_rows, test = prompts < 180, prompts >= 180
    maes = {}
    for shares in ((0.0,), (0.0, 0.5, 1.0)):
        config = EffectsConfig(alphas=(0.3, 3.0), ranks=(0,), neighbours=5,
                               neighbour_temperature=0.05, neighbour_shares=shares)
        fit = fit_effects(x, prompts[train_rows], models[train_rows], tokens[train_rows],
                          num_models, config, neighbour_inputs=x)
        maes[shares] = _held_out_mae(fit, x, prompts, models, tokens, test, config)
        if len(shares) > 1:
            assert fit.neighbour_share > 0
            assert len(fit.neighbour_prompts) == len(fit.neighbour_effects) == 180
    assert maes[(0.0, 0.5, 1.0)] < 0.8 * maes[(0.0,)]


def test_no_neighbours_without_an_embedding() -> None:
    x, prompts, models, tokens, num_models = _clustered_panel(num_prompts=60)
    fit = fit_effects(x, prompts, models, tokens, num_models,
                      EffectsConfig(alphas=(3.0,), ranks=(0,), neighbour_shares=(1.0,)),
                      neighbour_inputs=np.zeros((len(x), 0)))
    assert fit.neighbour_share == 0.0 and not len(fit.neighbour_prompts)
    with pytest.raises(ValueError, match="one row per row"):
        fit_effects(x, prompts, models, tokens, num_models, EffectsConfig(alphas=(3.0,)),
                    neighbour_inputs=x[:10])
