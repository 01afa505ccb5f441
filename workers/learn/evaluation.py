"""Evaluation of the length model on many models' answers: held-out prompts, new serving models,
the baselines, the cross-model reference, and the cost of a prediction.

Used by ``scripts/eval_length_many.py``. Every method trains on the training side of a split by
prompt only. Baselines (trained on the same rows): the per-model median, the per-model mean, and
a log-log regression of output on prompt tokens with one intercept per model. The reference is
not a predictor: the real answers of the other models to the same prompt (the median over them
of log length minus their model effect), plus this model's effect; it is the ceiling of what a
prompt tells about an answer's length.

New serving models: a set of models is held out of training altogether. After n of a held-out
model's answers to training prompts (its history), the online loop's correction
(`workers.learn.correction.fit_correction`, its effect shrunk towards the population prior by
the artifact's `prior_rows`) calibrates it; it is scored on its answers to the held-out prompts.
The baselines get the same n answers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from workers.learn.correction import CorrectionConfig, correction_config, fit_correction
from workers.predict.commands import CachedEncoder
from workers.predict.dataset import LengthRow
from workers.predict.effects import EffectsConfig, decompose
from workers.predict.features import TokenCounter
from workers.predict.length_model import (
    AnyEncoder,
    LengthPredictor,
    TrainConfig,
    design_matrix,
    length_metrics,
    train,
)

__all__ = ["BASELINES", "REFERENCE", "FeaturesOnly", "baseline_predictions", "choose_new_models",
           "cost_per_prompt", "known_models", "new_models", "prompt_folds",
           "reference_predictions"]

BASELINES = ("per-model median", "per-model mean", "log-log prompt-length regression")
REFERENCE = "reference: other models' real answers (ceiling, not a predictor)"
MAX_TOKENS = 16_384
_DEFAULT = TrainConfig()


class FeaturesOnly:
    """No embedding at all: the head sees only the cheap features (for the cost table)."""

    name = "features-only"
    dim = 0
    max_seq_len = 0

    class config:  # noqa: N801 - mimics an encoder's config
        tail_share = 0.0
        layers = (0,)
        num_layers = None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.zeros((len(texts), 0), dtype=np.float32)


def prompt_folds(rows: Sequence[LengthRow], num_folds: int, seed: int = 0) -> np.ndarray:
    """The fold of each row: every prompt's answers in one fold (seeded by prompt id)."""
    ids = sorted({r.prompt_id for r in rows})
    order = np.random.default_rng(seed).permutation(len(ids))
    fold_of = {ids[i]: k % num_folds for k, i in enumerate(order)}
    return np.array([fold_of[r.prompt_id] for r in rows], dtype=np.int64)


@dataclass(frozen=True)
class _Arrays:
    models: np.ndarray       # model name per row
    prompts: np.ndarray      # prompt index per row
    tokens: np.ndarray
    log_prompt: np.ndarray   # log1p prompt tokens per row


def _arrays(rows: Sequence[LengthRow], counter: TokenCounter) -> _Arrays:
    index: dict[str, int] = {}
    log_prompt: dict[str, float] = {}
    for r in rows:
        if r.prompt_id not in index:
            index[r.prompt_id] = len(index)
            log_prompt[r.prompt_id] = float(np.log1p(counter(r.prompt)))
    return _Arrays(np.array([r.model for r in rows]),
                   np.array([index[r.prompt_id] for r in rows]),
                   np.array([r.output_tokens for r in rows], dtype=np.float64),
                   np.array([log_prompt[r.prompt_id] for r in rows]))


def baseline_predictions(data: _Arrays, train: np.ndarray, test: np.ndarray,
                         calibration: dict[str, np.ndarray] | None = None
                         ) -> dict[str, np.ndarray]:
    """Each baseline's predictions of `test`; `calibration` maps a model absent from `train`
    to the rows of its answers the baselines may use (its first n answers)."""
    calibration = calibration or {}
    y, log_y = data.tokens, np.log(data.tokens)
    models = data.models
    names = np.unique(models[train])
    median = {m: np.median(y[train][models[train] == m]) for m in names}
    mean = {m: np.mean(y[train][models[train] == m]) for m in names}
    # Log-log regression with per-model intercepts: the slope from the within-model variation.
    slot = {m: i for i, m in enumerate(names)}
    s = np.array([slot[m] for m in models[train]])
    counts = np.bincount(s, minlength=len(names))
    x, ly = data.log_prompt[train], log_y[train]
    x_c = x - (np.bincount(s, weights=x) / counts)[s]
    y_c = ly - (np.bincount(s, weights=ly) / counts)[s]
    slope = float(x_c @ y_c / max(x_c @ x_c, 1e-12))
    intercepts = np.bincount(s, weights=ly - slope * x) / counts
    intercept = {m: intercepts[slot[m]] for m in names}
    pooled = (float(np.median(y[train])), float(np.mean(y[train])),
              float(np.average(intercepts, weights=counts)))
    for model, rows in calibration.items():
        if len(rows):
            median[model] = np.median(y[rows])
            mean[model] = np.mean(y[rows])
            intercept[model] = float(np.mean(log_y[rows] - slope * data.log_prompt[rows]))
    tm = models[test]
    return {
        "per-model median": np.array([median.get(m, pooled[0]) for m in tm]),
        "per-model mean": np.array([mean.get(m, pooled[1]) for m in tm]),
        "log-log prompt-length regression": np.exp(
            slope * data.log_prompt[test] + np.array([intercept.get(m, pooled[2]) for m in tm])),
    }


def _reference_effects(data: _Arrays, train: np.ndarray
                       ) -> tuple[dict[str, int], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(model slots, a per prompt, b and s per model, typical per model) from `train`."""
    names = sorted(set(data.models))
    slot = {m: i for i, m in enumerate(names)}
    m_all = np.array([slot[m] for m in data.models])
    a, b, s, _ = decompose(np.log(data.tokens[train]), data.prompts[train], m_all[train],
                           int(data.prompts.max()) + 1, len(names))
    typical = np.isfinite(b) & (s >= EffectsConfig().min_sensitivity)
    return slot, a, b, s, typical


def reference_predictions(data: _Arrays, train: np.ndarray, test: np.ndarray,
                          reference_models: set[str],
                          calibration: dict[str, np.ndarray] | None = None,
                          effects: tuple | None = None) -> np.ndarray:
    """The ceiling: for each test row, the median over the *other* reference models' real
    answers to the same prompt of (log length - their model effect), plus this model's effect.

    Model effects come from a decomposition of the training rows; a model absent from them takes
    its effect from its `calibration` rows (median of log length minus the prompt effect), or
    the median effect with none.
    """
    calibration = calibration or {}
    slot, a, b, s, typical = effects or _reference_effects(data, train)
    b, s = b.copy(), s.copy()
    names = sorted(slot, key=slot.get)
    m_all = np.array([slot[m] for m in data.models])
    log_y = np.log(data.tokens)
    prior = float(np.median(b[typical]))
    for model, rows in calibration.items():
        if len(rows):
            b[slot[model]] = float(np.median(log_y[rows] - np.nan_to_num(a[data.prompts[rows]])))
    b = np.where(np.isfinite(b), b, prior)
    s = np.where(np.isfinite(s), s, 1.0)
    is_ref = np.array([m in reference_models for m in names])
    out = np.empty(len(test))
    # Every row of the test prompts from reference models: those are the "other answers".
    test_prompts = np.unique(data.prompts[test])
    pool = np.flatnonzero(np.isin(data.prompts, test_prompts) & is_ref[m_all]
                          & typical[m_all])
    by_prompt: dict[int, np.ndarray] = {}
    order = np.argsort(data.prompts[pool], kind="stable")
    pool = pool[order]
    starts = np.searchsorted(data.prompts[pool], test_prompts)
    ends = np.searchsorted(data.prompts[pool], test_prompts, side="right")
    for p, lo, hi in zip(test_prompts, starts, ends, strict=True):
        by_prompt[int(p)] = pool[lo:hi]
    for k, i in enumerate(test):
        others = by_prompt.get(int(data.prompts[i]), np.array([], dtype=np.int64))
        others = others[others != i]
        effect = (float(np.median(log_y[others] - b[m_all[others]])) if len(others) else 0.0)
        out[k] = np.exp(b[m_all[i]] + s[m_all[i]] * effect)
    return out


def _metrics(predicted: np.ndarray, actual: np.ndarray) -> dict[str, float]:
    return length_metrics(np.clip(np.rint(predicted), 1, MAX_TOKENS), actual)


def known_models(rows: Sequence[LengthRow], encoders: dict[str, AnyEncoder], *,
                 num_folds: int = 5, seed: int = 0, config: TrainConfig = _DEFAULT
                 ) -> dict[str, dict[str, float]]:
    """MAE etc. on held-out prompts, every model in training, per method (pooled over folds)."""
    counter = TokenCounter()
    data = _arrays(rows, counter)
    fold = prompt_folds(rows, num_folds, seed)
    cached = {name: CachedEncoder(e) for name, e in encoders.items()}
    predicted: dict[str, list[np.ndarray]] = {}
    tested = []
    all_models = set(data.models)
    for k in range(num_folds):
        train_rows, test_rows = np.flatnonzero(fold != k), np.flatnonzero(fold == k)
        tested.append(test_rows)
        for name, values in baseline_predictions(data, train_rows, test_rows).items():
            predicted.setdefault(name, []).append(values)
        for name, encoder in cached.items():
            predictor, _ = train([rows[i] for i in train_rows], encoder=encoder,
                                 counter=counter, config=config)
            predicted.setdefault(name, []).append(_predict(predictor, rows, test_rows))
        predicted.setdefault(REFERENCE, []).append(
            reference_predictions(data, train_rows, test_rows, all_models))
    actual = data.tokens[np.concatenate(tested)]
    return {name: _metrics(np.concatenate(values), actual) for name, values in predicted.items()}


def _predict(predictor: LengthPredictor, rows: Sequence[LengthRow], index: np.ndarray
             ) -> np.ndarray:
    out = predictor.predict_batch([rows[i].prompt for i in index], [rows[i].model for i in index],
                                  MAX_TOKENS)
    return np.array([p.tokens for p in out], dtype=np.float64)


def choose_new_models(rows: Sequence[LengthRow], count: int, seed: int = 0) -> list[str]:
    """`count` models to hold out, drawn among the typical ones (prompt-sensitive, answers to
    nearly every prompt): a new serving model is assumed to be a real assistant."""
    names = sorted({r.model for r in rows})
    slot = {m: i for i, m in enumerate(names)}
    ids = sorted({r.prompt_id for r in rows})
    pid = {p: i for i, p in enumerate(ids)}
    log_y = np.log(np.array([max(r.output_tokens, 1) for r in rows], dtype=np.float64))
    _, _, s, _ = decompose(log_y, np.array([pid[r.prompt_id] for r in rows]),
                           np.array([slot[r.model] for r in rows]), len(ids), len(names))
    typical = [m for m in names if s[slot[m]] >= EffectsConfig().min_sensitivity]
    rng = np.random.default_rng(seed)
    return sorted(rng.choice(typical, size=min(count, len(typical)), replace=False).tolist())


def new_models(rows: Sequence[LengthRow], encoder: AnyEncoder, held: Sequence[str], *,
               counts: Sequence[int] = (0, 50, 200), num_folds: int = 3, seed: int = 0,
               config: TrainConfig = _DEFAULT) -> dict[int, dict[str, dict[str, float]]]:
    """{n answers: {method: metrics}} for the `held` models, none of whose answers is trained on.

    Fold k's prompts are the test prompts; a held model's history is its answers to the other
    prompts in a seeded random order, of which the first n calibrate it.
    """

    counter = TokenCounter()
    data = _arrays(rows, counter)
    fold = prompt_folds(rows, num_folds, seed)
    encoder = CachedEncoder(encoder)
    held_set = set(held)
    is_held = np.isin(data.models, list(held_set))
    rng = np.random.default_rng(seed)
    results: dict[int, dict[str, list[np.ndarray]]] = {n: {} for n in counts}
    actual: dict[int, list[np.ndarray]] = {n: [] for n in counts}
    reference_models = set(data.models[~is_held])
    for k in range(num_folds):
        train_rows = np.flatnonzero((fold != k) & ~is_held)
        predictor, _ = train([rows[i] for i in train_rows], encoder=encoder, counter=counter,
                             config=config)
        head = predictor.head
        correction = correction_config(head, CorrectionConfig())
        effects = _reference_effects(data, train_rows)
        for model in held:
            test_rows = np.flatnonzero((fold == k) & (data.models == model))
            history = rng.permutation(np.flatnonzero((fold != k) & (data.models == model)))
            for n in counts:
                first = history[:n]
                calibrated = predictor
                if n:
                    design = design_matrix([rows[i].prompt for i in first], [model] * len(first),
                                           encoder=predictor.encoder, counter=counter)
                    z = head.predict_log(design, corrected=False)[0]
                    fitted, _ = fit_correction(head.inputs(design), z, data.tokens[first],
                                               MAX_TOKENS, correction)
                    calibrated = predictor.with_head(head.with_correction(model, fitted))
                out = results[n]
                out.setdefault(f"length model ({encoder.name} + effects)", []).append(
                    _predict(calibrated, rows, test_rows))
                for name, values in baseline_predictions(
                        data, train_rows, test_rows, {model: first}).items():
                    out.setdefault(name, []).append(values)
                out.setdefault(REFERENCE, []).append(reference_predictions(
                    data, train_rows, test_rows, reference_models, {model: first}, effects))
                actual[n].append(data.tokens[test_rows])
    return {n: {name: _metrics(np.concatenate(v), np.concatenate(actual[n]))
                for name, v in methods.items()} for n, methods in results.items()}


def cost_per_prompt(predictor: LengthPredictor, prompts: Sequence[str], *, batch_size: int = 32,
                    model: str = "any", gap_s: float = 0.0) -> float:
    """CPU milliseconds of this process per prompt of `predict_batch` in batches (features,
    token count, encoder and head; after one warm-up batch). `gap_s`: an idle pause before each
    call, not counted, as between the requests of a low arrival rate (a call after a pause
    costs more: it runs cold)."""
    predictor.predict_batch(list(prompts[:batch_size]), model, MAX_TOKENS)
    spent = 0.0
    for start in range(0, len(prompts), batch_size):
        if gap_s:
            time.sleep(gap_s)
        started = time.process_time()
        predictor.predict_batch(list(prompts[start:start + batch_size]), model, MAX_TOKENS)
        spent += time.process_time() - started
    return spent * 1e3 / max(len(prompts), 1)

