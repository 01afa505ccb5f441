"""A serving model's own correction of the shared length head, fitted on that model's history.

The shared head (`workers.predict.length_model`) knows how long answers to a prompt tend to be
and gives each serving model it was trained on an intercept; a model it never saw gets the
pooled one. What a new model does differently is learned here from its own finished requests,
on the residuals r = log(actual) - z of the head's log point z:

    r ~ a + b * (z - mean z) + inputs @ w

- `a`: its verbosity (an intercept), the median residual, shrunk towards 0 by
  n / (n + prior_rows) so a handful of rows moves it little;
- `b`: its scale (does it stretch long answers more than short ones), unpenalised;
- `w`: what the prompt does differently to it, ridge on the head's own inputs (embedding and
  features), fitted in the n x n dual so a few hundred rows cost milliseconds.

Which of these terms are used and how hard `w` is penalised is chosen by time-ordered
(forward-chaining) cross-validation on the history: fit on the oldest blocks, score the next one,
in tokens. With little history the intercept alone wins; more terms earn their place only when
they predict the next requests better. `forward_chained` applies the whole procedure, selection
included, to the history the same way, so the loop judges a candidate on predictions of rows it
had not seen (`workers.learn.loop`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from workers.predict.length_model import LengthHead, ModelCorrection

__all__ = ["CorrectionConfig", "correction_config", "fit_correction", "forward_chained",
           "time_blocks"]


@dataclass(frozen=True, slots=True)
class CorrectionConfig:
    #: Ridge penalties tried for the prompt weights `w` (on inputs of squared norm about 170).
    penalties: tuple[float, ...] = (100.0, 300.0, 1000.0, 3000.0, 10000.0)
    #: Whether the scale term `b` may be used (the intercept always is).
    scale: bool = True
    #: Pseudo-rows of the intercept's prior at 0: a = median residual * n / (n + prior_rows).
    prior_rows: float = 10.0
    #: Time-ordered blocks of the cross-validation (fewer when there are few rows).
    num_blocks: int = 5
    min_block_rows: int = 10
    #: Newest history rows a correction is fitted on (the dual solve is cubic in them).
    max_rows: int = 1000
    #: The scale term is clipped to this range (a guard on extrapolation).
    slope_range: tuple[float, float] = (-0.8, 1.0)
    quantile: float = 0.9
    min_rows_quantile: int = 30


def correction_config(head: LengthHead, config: CorrectionConfig) -> CorrectionConfig:
    """`config` with the head's own prior weight of a model effect, where the head has one.

    An effects head (`workers.predict.effects`) measured how many answers of one model weigh as
    much as the spread of model effects across the models it was trained on: a new serving
    model's effect moves from the population prior towards its own median residual by
    n / (n + prior_rows).
    """
    if head.prior_rows is None:
        return config
    return replace(config, prior_rows=float(head.prior_rows))


class _Family(NamedTuple):
    slope: bool
    penalty: float | None  # None: no prompt weights


def _families(config: CorrectionConfig) -> list[_Family]:
    # NOTE: simplest first: a tie in the cross-validation keeps the simpler correction.
    slopes = (False, True) if config.scale else (False,)
    return [*(_Family(s, None) for s in slopes),
            *(_Family(s, p) for p in sorted(config.penalties, reverse=True) for s in slopes)]


def time_blocks(num_rows: int, config: CorrectionConfig) -> list[np.ndarray]:
    """Consecutive blocks of row indices (rows are oldest first); [] if too few for two."""
    num_blocks = min(config.num_blocks, num_rows // max(config.min_block_rows, 1))
    if num_blocks < 2:
        return []
    return [b for b in np.array_split(np.arange(num_rows), num_blocks) if len(b)]


class _Fit(NamedTuple):
    intercept: float
    slope: float
    center: float
    gamma: np.ndarray | None  # dual coefficients on the training rows (w = X_T.T @ gamma)
    train: np.ndarray


def _fit(kernel: np.ndarray, z: np.ndarray, r: np.ndarray, train: np.ndarray,
         families: list[_Family], config: CorrectionConfig) -> dict[_Family, _Fit]:
    """Fit every family on the rows `train`; one eigendecomposition per slope setting."""
    n = len(train)
    center = float(z[train].mean())
    r_t = r[train]
    shrink = n / (n + config.prior_rows)
    fits: dict[_Family, _Fit] = {}
    for slope in sorted({f.slope for f in families}):
        c = np.ones((n, 1)) if not slope else np.column_stack([np.ones(n), z[train] - center])
        c_pinv = np.linalg.pinv(c)
        project = np.eye(n) - c @ c_pinv
        penalties = [f.penalty for f in families if f.slope == slope]
        gammas: dict[float | None, np.ndarray | None] = {None: None}
        if any(p is not None for p in penalties):
            k_tt = kernel[np.ix_(train, train)]
            eigvals, eigvecs = np.linalg.eigh(project @ k_tt @ project)
            projected = eigvecs.T @ (project @ r_t)
            for p in penalties:
                if p is not None:
                    gammas[p] = project @ (eigvecs @ (projected / (np.maximum(eigvals, 0) + p)))
        for p in penalties:
            gamma = gammas[p]
            explained = kernel[np.ix_(train, train)] @ gamma if gamma is not None else 0.0
            beta = c_pinv @ (r_t - explained)
            b = float(np.clip(beta[1], *config.slope_range)) if slope else 0.0
            fitted = explained + beta[0] + b * (z[train] - center)
            # The median residual makes the point a median (what the error in tokens rewards).
            a = (float(beta[0]) + float(np.median(r_t - fitted))) * shrink
            fits[_Family(slope, p)] = _Fit(a, b, center, gamma, train)
    return fits


def _predict(fit: _Fit, kernel: np.ndarray, z: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Correction (log tokens) of `rows`."""
    out = fit.intercept + fit.slope * (z[rows] - fit.center)
    if fit.gamma is not None:
        out = out + kernel[np.ix_(rows, fit.train)] @ fit.gamma
    return out


def _token_errors(log_point: np.ndarray, tokens: np.ndarray, caps: np.ndarray) -> np.ndarray:
    predicted = np.clip(np.rint(np.exp(np.clip(log_point, 0.0, 20.0))), 1, caps)
    return np.abs(predicted - tokens)


def _select(kernel: np.ndarray, z: np.ndarray, r: np.ndarray, tokens: np.ndarray,
            caps: np.ndarray, rows: np.ndarray, config: CorrectionConfig) -> _Family:
    """The family with the lowest forward-chained error in tokens on `rows` (oldest first)."""
    families = _families(config)
    blocks = time_blocks(len(rows), config)
    if not blocks:
        return families[0]
    errors: dict[_Family, list[np.ndarray]] = {f: [] for f in families}
    for k in range(1, len(blocks)):
        train, score = rows[np.concatenate(blocks[:k])], rows[blocks[k]]
        for family, fit in _fit(kernel, z, r, train, families, config).items():
            errors[family].append(_token_errors(z[score] + _predict(fit, kernel, z, score),
                                                tokens[score], caps[score]))
    per_row = {f: np.concatenate(e) for f, e in errors.items()}
    best = min(families, key=lambda f: per_row[f].mean())
    # One-standard-error rule: the simplest family whose error is within one standard error
    # (of its paired difference with the best) of the best one: a more complex correction
    # must predict the next requests clearly better to be used, not by selection noise.
    for family in families:  # simplest first
        diff = per_row[family] - per_row[best]
        if diff.mean() <= diff.std(ddof=1) / np.sqrt(len(diff)) if len(diff) > 1 else True:
            return family
    return best


def _prepare(inputs: np.ndarray, z: np.ndarray, tokens: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.asarray(inputs, dtype=np.float64)
    z = np.asarray(z, dtype=np.float64)
    tokens = np.asarray(tokens, dtype=np.float64)
    if len(x) != len(z) or len(z) != len(tokens) or (tokens < 1).any():
        raise ValueError("need one input row, head log point and output length >= 1 per row")
    return x @ x.T, z, np.log(tokens) - z


def forward_chained(inputs: np.ndarray, z: np.ndarray, tokens: np.ndarray, caps: np.ndarray,
                    config: CorrectionConfig = CorrectionConfig()) -> np.ndarray:
    """Corrected log points of each row predicted from the rows before its block only (the
    whole procedure, selection included, refitted per block); NaN in the first block (or
    everywhere when there are too few rows for two blocks). Rows are oldest first."""
    kernel, z, r = _prepare(inputs, z, tokens)
    tokens = np.asarray(tokens, dtype=np.float64)
    caps = np.broadcast_to(np.asarray(caps, dtype=np.float64), z.shape)
    out = np.full(len(z), np.nan)
    blocks = time_blocks(len(z), config)
    for k in range(1, len(blocks)):
        past, rows = np.concatenate(blocks[:k]), blocks[k]
        family = _select(kernel, z, r, tokens, caps, past, config)
        [fit] = _fit(kernel, z, r, past, [family], config).values()
        out[rows] = z[rows] + _predict(fit, kernel, z, rows)
    return out


def fit_correction(inputs: np.ndarray, z: np.ndarray, tokens: np.ndarray, caps: np.ndarray,
                   config: CorrectionConfig = CorrectionConfig(), *, through: str = "",
                   log_q: float | None = None) -> tuple[ModelCorrection, dict]:
    """The correction fitted on all given rows (oldest first), its family chosen by
    time-ordered cross-validation; `inputs` are the head's scaled inputs of the rows and `z`
    its log points (without this model's correction). Returns it and what was chosen."""
    kernel, z, r = _prepare(inputs, z, tokens)
    tokens = np.asarray(tokens, dtype=np.float64)
    caps = np.broadcast_to(np.asarray(caps, dtype=np.float64), z.shape)
    rows = np.arange(len(z))
    family = _select(kernel, z, r, tokens, caps, rows, config)
    [fit] = _fit(kernel, z, r, rows, [family], config).values()
    weights = (None if fit.gamma is None
               else (np.asarray(inputs, dtype=np.float64).T @ fit.gamma).astype(np.float32))
    correction = ModelCorrection(intercept=fit.intercept, slope=fit.slope, center=fit.center,
                                 weights=weights, log_q=log_q, rows=len(z), through=through,
                                 penalty=family.penalty)
    return correction, {"slope": family.slope, "penalty": family.penalty,
                        "intercept": fit.intercept, "scale": fit.slope}
