"""Many answers per prompt: a model effect, a prompt effect and prompt x model interactions.

On log output tokens L of serving model m's answer to prompt p::

    L[p, m] = b[m] + s[m] * a[p] + g(x[p]) . v[m] + noise

- `b[m]`, the model effect: how verbose m is (its median log length, once prompts are removed);
- `a[p]`, the prompt effect: how long answers to p are, whoever answers; the model predicts it
  from the prompt's inputs x[p] by ridge, `f(x) ~ a`, blended with the effects of the training
  prompts nearest to p in embedding space (`neighbour_effect`: a softmax over the cosine
  similarities of the `neighbours` nearest; the blend's share is chosen by cross-validation);
- `s[m]`, the model's sensitivity to the prompt effect (1 for a typical model; 0 for a model whose
  answers ignore the prompt, such as one that always writes the same text);
- `g(x) . v[m]`: what a prompt does to a kind of model beyond that, a reduced-rank ridge of the
  residuals on x: the `rank` directions of prompt space that move models differently, and each
  model's loadings on them.

The effects are found by a robust two-way decomposition (median polish, as ProD fits the median
of many generations per prompt: one answer is a noisy draw, 224 answers' median is not), then
the prompt model is fitted on one row per prompt, the prompt effect, weighted by how many
answers estimate it. Penalties and the rank are chosen by cross-validation grouped by prompt,
on the error in tokens. Everything here is numpy and works on prompt-level inputs; the caller
(`length_model`) builds the inputs and turns the fit into a `LengthHead`.

A serving model absent from training gets the population prior: the median model effect of the
typical models, sensitivity 1 and no interaction. `prior_rows` (noise variance of one answer
over the variance of model effects) says how many answers of a new model weigh as much as that
prior, for the shrinkage of its effect (`workers.learn.correction`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["EffectsConfig", "EffectsFit", "decompose", "fit_effects", "group_median",
           "neighbour_effect", "unit_rows"]


@dataclass(frozen=True, slots=True)
class EffectsConfig:
    #: Ridge penalties of the prompt effect (inputs have squared norm about 30-200).
    alphas: tuple[float, ...] = (1.0, 3.0, 10.0, 30.0, 100.0, 300.0)
    #: Ranks of the interaction tried (0: none) and their ridge penalties.
    ranks: tuple[int, ...] = (0, 2, 4, 8)
    interaction_alphas: tuple[float, ...] = (30.0, 100.0, 300.0)
    #: Folds of the grouped cross-validation (fewer if there are few prompts).
    num_folds: int = 5
    seed: int = 0
    #: Rounds of the median polish.
    iterations: int = 5
    #: A model whose sensitivity to the prompt effect is below this is "prompt-insensitive": it
    #: keeps its own effect and sensitivity but is left out of the prompt effect and the
    #: interaction (NullModel's one fixed text, gpt4_gamed's one-token answers).
    min_sensitivity: float = 0.3
    #: Models need this many answers for their own sensitivity and interaction loadings
    #: (else 1 and none); prompts need this many typical answers to count fully in the ridge
    #: (weight n / (n + prompt_prior_answers)).
    min_model_answers: int = 20
    prompt_prior_answers: float = 2.0
    #: Nearest training prompts whose effects an unseen prompt borrows, the softmax temperature
    #: on their cosine similarities, and the shares of that borrowed effect in the prompt effect
    #: tried by the cross-validation (0: ridge only).
    #: NOTE: borrowing lowers the cross-validated MAE on unseen prompts, and the result is flat
    #: around these values (figures: docs/measurements.md, "Length model").
    neighbours: int = 20
    neighbour_temperature: float = 0.02
    neighbour_shares: tuple[float, ...] = (0.0, 0.2, 0.35, 0.5)


@dataclass(frozen=True)
class EffectsFit:
    """The fitted effects; inputs are what the caller passed as `x` (one row per prompt)."""

    model_effects: np.ndarray        # (M,) b[m] + its median out-of-fold residual
    sensitivities: np.ndarray        # (M,) s[m]
    prompt_weights: np.ndarray       # (d,) f(x) = x @ prompt_weights + prompt_bias
    prompt_bias: float
    factor_weights: np.ndarray       # (d, rank): g(x) = x @ factor_weights
    model_factors: np.ndarray        # (M, rank): v[m]
    prior_effect: float              # the model effect of an unknown serving model
    prior_scale: float               # the sensitivity of an unknown serving model
    prior_rows: float                # answers that weigh as much as that prior
    insensitive: tuple[int, ...]     # models left out of the prompt effect
    neighbour_share: float           # share of the neighbours' effect (0: none)
    neighbour_prompts: np.ndarray    # (n,) rows of `x` whose effects neighbours lend
    neighbour_effects: np.ndarray    # (n,) their prompt effects times the share
    oof_log: np.ndarray              # (rows,) out-of-fold log predictions (after the offset)
    alpha: float
    rank: int
    interaction_alpha: float
    num_folds: int


def group_median(values: np.ndarray, groups: np.ndarray, num_groups: int,
                 weights: np.ndarray | None = None) -> np.ndarray:
    """Weighted median of `values` per group (NaN for a group with no weight)."""
    values = np.asarray(values, dtype=np.float64)
    weights = np.ones(len(values)) if weights is None else np.asarray(weights, np.float64)
    keep = weights > 0
    values, groups, weights = values[keep], np.asarray(groups)[keep], weights[keep]
    out = np.full(num_groups, np.nan)
    if not len(values):
        return out
    order = np.lexsort((values, groups))
    values, groups, weights = values[order], groups[order], weights[order]
    cumulative = np.cumsum(weights)
    starts = np.searchsorted(groups, np.arange(num_groups), side="left")
    ends = np.searchsorted(groups, np.arange(num_groups), side="right")
    present = ends > starts
    before = np.where(starts > 0, cumulative[np.maximum(starts - 1, 0)], 0.0)
    half = before + (cumulative[np.maximum(ends - 1, 0)] - before) / 2
    index = np.clip(np.searchsorted(cumulative, half[present] - 1e-12), starts[present],
                    ends[present] - 1)
    out[present] = values[index]
    return out


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """`matrix` (float32) with each row scaled to unit length (a zero row stays zero)."""
    rows = np.asarray(matrix, dtype=np.float32)
    return rows / np.maximum(np.linalg.norm(rows, axis=1), 1e-12)[:, None]


def neighbour_effect(queries: np.ndarray, anchors: np.ndarray, effects: np.ndarray, *,
                     neighbours: int, temperature: float,
                     unit_anchors: bool = False) -> np.ndarray:
    """For each query row, the softmax-weighted mean of the effects of its `neighbours` most
    cosine-similar anchors (0 with no anchor). Rows need not be unit-norm; `unit_anchors` says
    the anchors' are already (`unit_rows`), which saves scaling them on every call: a head
    predicting one prompt at a time keeps them so (docs/measurements.md)."""
    if not len(anchors) or not len(queries):
        return np.zeros(len(queries))
    similarity = unit_rows(queries) @ (
        np.asarray(anchors, dtype=np.float32) if unit_anchors else unit_rows(anchors)).T
    k = min(neighbours, len(anchors))
    nearest = np.argpartition(-similarity, k - 1, axis=1)[:, :k]
    top = np.take_along_axis(similarity, nearest, 1).astype(np.float64)
    weight = np.exp((top - top.max(1, keepdims=True)) / temperature)
    return (weight * effects[nearest]).sum(1) / weight.sum(1)


def decompose(log_y: np.ndarray, prompts: np.ndarray, models: np.ndarray, num_prompts: int,
              num_models: int, config: EffectsConfig = EffectsConfig()
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Median polish with sensitivities: (a per prompt, b per model, s per model, typical rows).

    `a` is centred (median 0 over prompts) and NaN where a prompt has no typical answer.
    """
    counts = np.bincount(models, minlength=num_models)
    b = group_median(log_y, models, num_models)
    s = np.ones(num_models)
    typical = np.ones(len(log_y), dtype=bool)
    a = np.zeros(num_prompts)
    for _ in range(config.iterations):
        a = group_median(log_y - b[models], prompts, num_prompts, typical.astype(np.float64))
        a -= np.nanmedian(a)
        known = np.isfinite(a[prompts])
        ap = np.where(known, a[prompts], 0.0)
        # Each model's sensitivity: least squares slope of its (L - b) on a, where a is known.
        centred = np.where(known, log_y - group_median(log_y, models, num_models)[models], 0.0)
        mean_a = np.bincount(models, weights=ap, minlength=num_models) / np.maximum(counts, 1)
        mean_c = np.bincount(models, weights=centred, minlength=num_models) / np.maximum(counts, 1)
        num = (np.bincount(models, weights=centred * ap, minlength=num_models)
               - counts * mean_a * mean_c)
        var = np.bincount(models, weights=ap * ap, minlength=num_models) - counts * mean_a ** 2
        s = np.where((counts >= config.min_model_answers) & (var > 1e-9),
                     num / np.maximum(var, 1e-9), 1.0)
        s = np.clip(s, 0.0, 3.0)
        b = group_median(log_y - s[models] * ap, models, num_models)
        typical = s[models] >= config.min_sensitivity
    return a, b, s, typical


def _ridge(x: np.ndarray, y: np.ndarray, w: np.ndarray, alphas: Sequence[float]
           ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Weighted ridge with an unpenalised intercept, y of shape (n,) or (n, k), every penalty
    from one SVD: [(coef (d[, k]), intercept)] per alpha."""
    w = w / max(w.sum(), 1e-12)
    x_mean = w @ x
    y_mean = w @ y
    root = np.sqrt(w)[:, None]
    xs = (x - x_mean) * root
    ys = (y - y_mean) * (root if y.ndim == 2 else root[:, 0])
    u, sv, vt = np.linalg.svd(xs, full_matrices=False)
    uy = u.T @ ys
    out = []
    for alpha in alphas:
        # NOTE: the penalty is on the weighted problem scaled to total weight 1; dividing it by
        # the number of rows keeps alphas comparable across data sizes.
        shrink = sv / (sv ** 2 + alpha / len(x))
        coef = vt.T @ ((shrink[:, None] * uy) if y.ndim == 2 else shrink * uy)
        out.append((coef, y_mean - x_mean @ coef))
    return out


def _folds(num_prompts: int, num_folds: int, seed: int) -> np.ndarray:
    order = np.random.default_rng(seed).permutation(num_prompts)
    fold = np.empty(num_prompts, dtype=np.int64)
    fold[order] = np.arange(num_prompts) % num_folds
    return fold


@dataclass(frozen=True)
class _Stage:
    """What one training set gives: effects, and prompt / interaction models per penalty."""

    a: np.ndarray
    b: np.ndarray
    s: np.ndarray
    typical: np.ndarray
    has: np.ndarray          # prompts with a prompt effect (the neighbours' anchors)
    prompt_path: list[tuple[np.ndarray, np.ndarray]]
    interactions: dict[tuple[int, float], tuple[np.ndarray, np.ndarray, np.ndarray]]


def _fit_stage(x: np.ndarray, log_y: np.ndarray, prompts: np.ndarray, models: np.ndarray,
               rows: np.ndarray, num_models: int, config: EffectsConfig,
               alphas: Sequence[float], ranks: Sequence[int],
               interaction_alphas: Sequence[float]) -> _Stage:
    """Fit on the rows `rows` (prompt indices refer to `x`)."""
    num_prompts = len(x)
    p, m, y = prompts[rows], models[rows], log_y[rows]
    a, b, s, typical = decompose(y, p, m, num_prompts, num_models, config)
    n_typical = np.bincount(p[typical], minlength=num_prompts).astype(np.float64)
    has = np.isfinite(a) & (n_typical > 0)
    weight = n_typical / (n_typical + config.prompt_prior_answers)
    prompt_path = _ridge(x[has], a[has], weight[has], alphas)
    interactions: dict[tuple[int, float], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    if any(r > 0 for r in ranks):
        counts = np.bincount(m[typical], minlength=num_models)
        eligible = (counts >= config.min_model_answers) & (s >= config.min_sensitivity)
        cells = typical & eligible[m] & has[p]
        residual = y - b[m] - s[m] * np.where(has[p], a[p], 0.0)
        sums = np.zeros((num_prompts, num_models))
        hits = np.zeros((num_prompts, num_models))
        np.add.at(sums, (p[cells], m[cells]), residual[cells])
        np.add.at(hits, (p[cells], m[cells]), 1.0)
        matrix = np.divide(sums, hits, out=np.zeros_like(sums), where=hits > 0)
        for alpha, (coef, _) in zip(interaction_alphas,
                                    _ridge(x[has], matrix[has], weight[has],
                                           interaction_alphas), strict=True):
            fitted = (x[has] - weight[has] @ x[has] / weight[has].sum()) @ coef
            _, _, vt = np.linalg.svd(fitted, full_matrices=False)
            for rank in ranks:
                if rank <= 0:
                    continue
                basis = vt[:rank].T                     # (M, rank)
                interactions[(rank, alpha)] = (coef @ basis, basis,
                                               weight[has] @ x[has] / weight[has].sum())
    return _Stage(a, b, s, typical, has, prompt_path, interactions)


def _predict(stage: _Stage, x: np.ndarray, prompts: np.ndarray, models: np.ndarray,
             alpha_index: int, interaction: tuple[int, float] | None,
             prior: tuple[float, float], share: float = 0.0,
             borrowed: np.ndarray | None = None) -> np.ndarray:
    """Log predictions of rows; models never seen by `stage` get the prior (effect, s=1).

    `borrowed` (one value per row of `x`) is the neighbours' prompt effect, weighing `share`.
    """
    # NOTE: per prompt first, then per row: x has one row per prompt, rows are many more.
    coef, bias = stage.prompt_path[alpha_index]
    f = (x @ coef + bias)[prompts]
    if share:
        assert borrowed is not None, "a neighbour share needs the borrowed effects"
        f = (1.0 - share) * f + share * borrowed[prompts]
    known = np.isfinite(stage.b[models])
    b = np.where(known, stage.b[models], prior[0])
    s = np.where(known, stage.s[models], prior[1])
    out = b + s * f
    if interaction is not None:
        g, factors, centre = stage.interactions[interaction]
        out = out + np.where(known, (((x - centre) @ g)[prompts] * factors[models]).sum(1), 0.0)
    return out


def _prior(stage: _Stage, config: EffectsConfig) -> tuple[float, float]:
    typical = np.isfinite(stage.b) & (stage.s >= config.min_sensitivity)
    if not typical.any():
        typical = np.isfinite(stage.b)
    return float(np.median(stage.b[typical])), float(np.median(stage.s[typical]))


def _token_mae(log_pred: np.ndarray, tokens: np.ndarray, cap: float) -> float:
    return float(np.abs(np.clip(np.rint(np.exp(np.clip(log_pred, 0, 20))), 1, cap)
                        - tokens).mean())


#: (prompt penalty index, interaction (rank, penalty) or None, neighbour share index)
_Choice = tuple[int, tuple[int, float] | None, int]


def _borrowed(stage: _Stage, neighbour_inputs: np.ndarray, prompts: np.ndarray,
              config: EffectsConfig) -> np.ndarray:
    """The neighbours' prompt effect of each prompt in `prompts` (one value per prompt row)."""
    out = np.zeros(len(neighbour_inputs))
    wanted = np.unique(prompts)
    anchors = np.flatnonzero(stage.has)
    out[wanted] = neighbour_effect(neighbour_inputs[wanted], neighbour_inputs[anchors],
                                   stage.a[anchors], neighbours=config.neighbours,
                                   temperature=config.neighbour_temperature)
    return out


def fit_effects(x: np.ndarray, prompts: np.ndarray, models: np.ndarray, tokens: np.ndarray,
                num_models: int, config: EffectsConfig = EffectsConfig(), *,
                max_tokens: int = 4096, neighbour_inputs: np.ndarray | None = None
                ) -> EffectsFit:
    """Fit the effects on rows (prompt index into `x`, model index, output tokens >= 1).

    The penalties, the rank and the neighbours' share are chosen by `config.num_folds`-fold
    cross-validation grouped by prompt (every step, the decomposition included, refitted
    without the fold); the final fit uses every row. Each model's effect then absorbs its
    median out-of-fold residual. `neighbour_inputs` (one row per row of `x`, e.g. the prompts'
    embeddings) are what the neighbours are found by; None: no neighbours.
    """
    x = np.asarray(x, dtype=np.float64)
    prompts = np.asarray(prompts, dtype=np.int64)
    models = np.asarray(models, dtype=np.int64)
    tokens = np.asarray(tokens, dtype=np.float64)
    if (tokens < 1).any():
        raise ValueError("output_tokens must be >= 1")
    if neighbour_inputs is not None and not np.shape(neighbour_inputs)[1]:
        neighbour_inputs = None  # no embedding at all (features only): nothing to be near
    if neighbour_inputs is not None and len(neighbour_inputs) != len(x):
        raise ValueError("neighbour_inputs needs one row per row of x")
    shares = tuple(config.neighbour_shares) if neighbour_inputs is not None else (0.0,)
    log_y = np.log(tokens)
    num_prompts = len(x)
    used = np.unique(prompts)
    num_folds = min(config.num_folds, len(used))
    alphas, ranks = tuple(config.alphas), tuple(config.ranks)
    interaction_alphas = tuple(config.interaction_alphas)
    oof: dict[_Choice, np.ndarray] = {}
    if num_folds >= 2:
        fold = _folds(num_prompts, num_folds, config.seed)[prompts]
        # Stage one: the prompt penalty without interactions; stage two: the interaction.
        for k in range(num_folds):
            train, held = np.flatnonzero(fold != k), np.flatnonzero(fold == k)
            stage = _fit_stage(x, log_y, prompts, models, train, num_models, config, alphas,
                               ranks, interaction_alphas)
            prior = _prior(stage, config)
            borrowed = (_borrowed(stage, neighbour_inputs, prompts[held], config)
                        if neighbour_inputs is not None else None)
            for a_i in range(len(alphas)):
                for key in (None, *stage.interactions):
                    for n_i, share in enumerate(shares):
                        oof.setdefault((a_i, key, n_i), np.full(len(tokens), np.nan))[held] = (
                            _predict(stage, x, prompts[held], models[held], a_i, key, prior,
                                     share, borrowed))
        scores = {c: _token_mae(v + np.median(log_y - v), tokens, max_tokens)
                  for c, v in oof.items()}
        best = min(scores, key=scores.get)
        # NOTE: an interaction must earn its place: within 0.2 % of the best without one, none.
        plain = min((c for c in scores if c[1] is None), key=scores.get)
        if scores[plain] <= scores[best] * 1.002:
            best = plain
        log_pred = oof[best]
    else:
        best = (len(alphas) // 2, None, 0)
        log_pred = None
    alpha_index, interaction, share_index = best
    share = shares[share_index]
    stage = _fit_stage(x, log_y, prompts, models, np.arange(len(tokens)), num_models, config,
                       [alphas[alpha_index]], ranks if interaction else (),
                       [interaction[1]] if interaction else ())
    prior = _prior(stage, config)
    if log_pred is None:
        log_pred = _predict(stage, x, prompts, models, 0, interaction, prior)
    residual = log_y - log_pred
    # Each model's effect takes its median out-of-fold residual (shrunk for a model with few
    # answers), the prior the pooled one: the point becomes a median, what MAE rewards.
    counts = np.bincount(models, minlength=num_models).astype(np.float64)
    pooled_shift = float(np.median(residual))
    shift = group_median(residual, models, num_models)
    shrink = counts / (counts + config.min_model_answers)
    shift = np.where(np.isfinite(shift), pooled_shift + shrink * (shift - pooled_shift),
                     pooled_shift)
    coef, bias = stage.prompt_path[0]
    if interaction is not None:
        g, factors, centre = stage.interactions[interaction]
        bias_g = -centre @ g
    else:
        g, factors, bias_g = np.zeros((x.shape[1], 0)), np.zeros((num_models, 0)), None
    effects = np.where(np.isfinite(stage.b), stage.b, prior[0]) + shift
    oof_log = log_pred + shift[models]
    # NOTE: the interaction's centring is folded into the effects: (x - c) @ g . v = x @ g . v
    # - (c @ g) . v.
    if bias_g is not None:
        effects = effects + np.where(np.isfinite(stage.b), factors @ bias_g, 0.0)
    typical_models = np.isfinite(stage.b) & (stage.s >= config.min_sensitivity)
    effect_var = float(np.var(effects[typical_models])) if typical_models.sum() > 1 else 0.0
    noise_var = float(np.median(np.abs(log_y - oof_log)) * 1.4826) ** 2
    prior_rows = noise_var / effect_var if effect_var > 0 else 10.0
    insensitive = tuple(int(i) for i in np.flatnonzero(np.isfinite(stage.b)
                                                        & (stage.s < config.min_sensitivity)))
    anchors = np.flatnonzero(stage.has) if share else np.zeros(0, dtype=np.int64)
    return EffectsFit(
        model_effects=effects, sensitivities=np.where(np.isfinite(stage.b), stage.s, prior[1]),
        # NOTE: the blend is folded into the stored parts: f = (1 - share) (x @ w + c)
        # + neighbour_effect(x, anchors, share * a).
        prompt_weights=(1.0 - share) * coef, prompt_bias=(1.0 - share) * float(bias),
        factor_weights=g, model_factors=factors,
        prior_effect=prior[0] + pooled_shift, prior_scale=prior[1], prior_rows=float(prior_rows),
        insensitive=insensitive, neighbour_share=float(share), neighbour_prompts=anchors,
        neighbour_effects=share * stage.a[anchors], oof_log=oof_log,
        alpha=float(alphas[alpha_index]),
        rank=0 if interaction is None else int(interaction[0]),
        interaction_alpha=float(interaction[1]) if interaction else 0.0,
        num_folds=int(num_folds))
