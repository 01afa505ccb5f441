"""Fit an execution-time model from Vidur-format GPU profiling CSVs.

Vidur profiles one transformer layer's operations: ``mlp.csv`` times the
token-parallel ones (norms, projections, MLP, rope, residual add, embedding) by
``num_tokens``; ``attention.csv`` times attention by batch shape (decode: batch
size x KV length; prefill: chunk x KV already cached) plus the KV-cache write.
All times are milliseconds per layer. A step then costs, as in Vidur's
``ExecutionTime``, ``num_layers x (token ops + KV write + decode attention +
prefill attention)``, plus the embedding once.

Each part is fitted by least squares on a seeded share of the rows and checked on
the rest; the parts are linear in the `ExecModel` features, so they add up into one
model. The token part is piecewise linear: GEMMs are memory-bound (flat) for small
batches and compute-bound (linear) beyond.

NOTE: Vidur's CPU overheads (scheduling, sampling, input preparation) are not in
these files, so a model fitted here prices only GPU work; a fit to real engine
step samples (`fit_from_step_samples`) includes them.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from .exec_model import BatchStats, ExecModel, feature_names, fit_linear, fit_metrics, split_holdout

__all__ = [
    "AttentionProfile",
    "AttentionScale",
    "PROFILE_TOKEN_KNOTS",
    "TokenProfile",
    "fit_from_vidur_profile",
    "gpu_time_ratios",
    "load_attention_profile",
    "load_token_profile",
]

#: Per-layer operations timed by num_tokens in mlp.csv (Vidur's block composition).
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
             "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
#: Operations that run once per step, not per layer.
STEP_OPS = ("emb",)
#: Hinges of the token term for profile fits (the grid reaches 4096 tokens).
PROFILE_TOKEN_KNOTS: tuple[int, ...] = (32, 64, 128, 256, 512, 1024, 2048)
#: Neighbours on each side used to spot a broken measurement.
_OUTLIER_WINDOW = 3
#: A value this far (as a ratio) from its neighbours' median is a broken measurement.
_OUTLIER_RATIO = 2.0


def _median_column(op: str) -> str:
    return f"time_stats.{op}.median"


def _read_rows(path: Path, num_tp_workers: int) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    return [r for r in rows if int(r["num_tensor_parallel_workers"]) == num_tp_workers]


def _to_float(text: str | None) -> float:
    return float(text) if text not in (None, "") else math.nan


def clean_series(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """`y` with missing and broken values replaced by interpolation along `x`.

    A value is broken when it is more than `_OUTLIER_RATIO` times off the median
    of its neighbours (the profiles contain a few 0.002 ms GEMMs, for instance).
    A column with no positive value is an operation the model lacks: all zeros.
    """
    order = np.argsort(x, kind="stable")
    xs, ys = x[order], y[order].copy()
    valid = np.isfinite(ys) & (ys > 0)
    if not valid.any():
        return np.zeros_like(y)  # an operation the model does not have
    index = np.flatnonzero(valid)
    for position, i in enumerate(index):
        lo, hi = max(position - _OUTLIER_WINDOW, 0), position + _OUTLIER_WINDOW + 1
        neighbours = np.delete(ys[index[lo:hi]], position - lo)
        reference = float(np.median(neighbours)) if len(neighbours) else ys[i]
        if not 1 / _OUTLIER_RATIO <= ys[i] / reference <= _OUTLIER_RATIO:
            valid[i] = False
    ys[~valid] = np.interp(xs[~valid], xs[valid], ys[valid])
    cleaned = np.empty_like(ys)
    cleaned[order] = ys
    return cleaned


@dataclass(frozen=True, slots=True)
class TokenProfile:
    """Token-parallel op times from mlp.csv, cleaned: per layer and per step."""

    #: Sorted, unique.
    num_tokens: np.ndarray
    #: Sum of `LAYER_OPS`, ms per layer.
    layer_ms: np.ndarray
    #: Sum of `STEP_OPS`, ms per step.
    step_ms: np.ndarray

    def interpolate(self, num_tokens: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """Per-layer and per-step times at `num_tokens` (the grid is sorted)."""
        return (np.interp(num_tokens, self.num_tokens, self.layer_ms),
                np.interp(num_tokens, self.num_tokens, self.step_ms))


@dataclass(frozen=True, slots=True)
class AttentionProfile:
    """Attention rows from attention.csv, ms per layer."""

    is_prefill: np.ndarray
    batch_size: np.ndarray
    chunk: np.ndarray
    kv_cache_size: np.ndarray
    #: attn_prefill or attn_decode, whichever the row times.
    attention_ms: np.ndarray
    #: attn_kv_cache_save plus the input/output reshapes.
    kv_write_ms: np.ndarray

    @property
    def num_tokens(self) -> np.ndarray:
        return np.maximum(self.chunk, self.batch_size)

    def subset(self, index: np.ndarray) -> AttentionProfile:
        return AttentionProfile(*(getattr(self, f.name)[index] for f in fields(self)))


@dataclass(frozen=True, slots=True)
class AttentionScale:
    """Factors for attention profiled on a different model (same head size) or GPU.

    Decode attention and the KV write move KV bytes, so they scale with KV heads;
    prefill attention is compute-bound and scales with query heads (`kv`, `prefill`:
    the per-token terms only). On another GPU every decode-attention and KV-write term
    scales with the time the GPU takes to move bytes (`memory`), every prefill-attention
    term with the time it takes to compute (`compute`): target time / profiled time, from
    `gpu_time_ratios`.
    """

    kv: float = 1.0
    prefill: float = 1.0
    memory: float = 1.0
    compute: float = 1.0


#: Token counts at which one layer's token-parallel ops are memory-bound (the weights are
#: read once, whatever the batch) and compute-bound (GEMMs at full occupancy) on every GPU
#: profiled here (A30, A100, H100: see `gpu_time_ratios`).
MEMORY_BOUND_MAX_TOKENS = 32
COMPUTE_BOUND_MIN_TOKENS = 1024


def gpu_time_ratios(reference: TokenProfile, target: TokenProfile) -> tuple[float, float]:
    """(memory, compute): how long `target`'s GPU takes for what `reference`'s takes 1.

    Both profiles time the same model's token-parallel ops. The memory ratio is the median
    of target / reference layer times at up to `MEMORY_BOUND_MAX_TOKENS` tokens, the compute
    ratio the median at `COMPUTE_BOUND_MIN_TOKENS` tokens and more (Llama-2-7B: A100 / A30
    0.48 and 0.50, H100 / A30 0.29 and 0.16; the datasheets' bandwidth and dense BF16 ratios
    are 0.46 and 0.53, 0.28 and 0.17).
    """
    def median_ratio(mask_of: Callable[[np.ndarray], np.ndarray]) -> float:
        tokens = reference.num_tokens[mask_of(reference.num_tokens)]
        tokens = tokens[(tokens >= target.num_tokens.min()) & (tokens <= target.num_tokens.max())]
        if not len(tokens):
            raise ValueError("the profiles share no token counts in that regime")
        ref_ms, _ = reference.interpolate(tokens)
        target_ms, _ = target.interpolate(tokens)
        return float(np.median(target_ms / ref_ms))

    return (median_ratio(lambda t: t <= MEMORY_BOUND_MAX_TOKENS),
            median_ratio(lambda t: t >= COMPUTE_BOUND_MIN_TOKENS))


def load_token_profile(path: str | Path, num_tp_workers: int = 1) -> TokenProfile:
    rows = _read_rows(Path(path), num_tp_workers)
    tokens = np.array([float(r["num_tokens"]) for r in rows])
    tokens, unique_index = np.unique(tokens, return_index=True)
    rows = [rows[i] for i in unique_index]

    def total(ops: Sequence[str]) -> np.ndarray:
        return sum(clean_series(tokens, np.array([_to_float(r.get(_median_column(op)))
                                                  for r in rows])) for op in ops)

    return TokenProfile(tokens, total(LAYER_OPS), total(STEP_OPS))


def load_attention_profile(path: str | Path, num_tp_workers: int = 1) -> AttentionProfile:
    rows = _read_rows(Path(path), num_tp_workers)

    def column(name: str) -> np.ndarray:
        return np.array([_to_float(r.get(name)) for r in rows])

    is_prefill = np.array([r["is_prefill"] == "True" for r in rows])
    attention = np.where(is_prefill, column(_median_column("attn_prefill")),
                         column(_median_column("attn_decode")))
    write = sum(np.nan_to_num(column(_median_column(op)))
                for op in ("attn_kv_cache_save", "attn_input_reshape", "attn_output_reshape"))
    keep = np.isfinite(attention) & (attention > 0)
    return AttentionProfile(is_prefill[keep], column("batch_size")[keep],
                            column("prefill_chunk_size")[keep], column("kv_cache_size")[keep],
                            attention[keep], write[keep])


# -- component fits ---------------------------------------------------------------------
def _token_features(num_tokens: np.ndarray, knots: Sequence[int]) -> np.ndarray:
    return np.column_stack([np.ones_like(num_tokens), num_tokens,
                            *(np.maximum(num_tokens - k, 0) for k in knots)])


def _decode_features(att: AttentionProfile) -> np.ndarray:
    return np.column_stack([np.ones_like(att.batch_size), att.batch_size,
                            att.batch_size * att.kv_cache_size])


def _prefill_features(att: AttentionProfile) -> np.ndarray:
    return np.column_stack([np.ones_like(att.chunk), att.chunk * att.kv_cache_size,
                            att.chunk ** 2])


def _metrics(prefix: str, y: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    return {f"{prefix}_{k}_holdout": v for k, v in fit_metrics(y, y_pred).items()} | {
        f"{prefix}_num_holdout": float(len(y))}


@dataclass(frozen=True, slots=True)
class _AttentionFit:
    decode: np.ndarray   # ms per layer: [intercept, per decode, per context token]
    prefill: np.ndarray  # ms per layer: [per prefill seq, per chunk x context, per chunk^2]
    kv_write: np.ndarray  # ms per layer: [intercept, per token]
    metrics: dict[str, float]


def _fit_attention(att: AttentionProfile, holdout_fraction: float, seed: int) -> _AttentionFit:
    train, holdout = split_holdout(len(att.attention_ms), holdout_fraction, seed)
    fitted, metrics = {}, {}
    for label, rows, features in (("decode", ~att.is_prefill, _decode_features),
                                  ("prefill", att.is_prefill, _prefill_features)):
        part_train = att.subset(train[rows[train]])
        part_holdout = att.subset(holdout[rows[holdout]])
        coef = fit_linear(features(part_train), part_train.attention_ms)
        fitted[label] = coef
        if len(part_holdout.attention_ms):
            metrics |= _metrics(f"{label}_attention", part_holdout.attention_ms,
                                features(part_holdout) @ coef)
    write_train = att.subset(train)
    write_x = np.column_stack([np.ones_like(write_train.kv_write_ms), write_train.num_tokens])
    write = fit_linear(write_x, write_train.kv_write_ms)
    return _AttentionFit(fitted["decode"], fitted["prefill"], write, metrics)


def fit_from_vidur_profile(mlp_csv: str | Path, attention_csv: str | Path, *, num_layers: int,
                           name: str, attention_scale: AttentionScale = AttentionScale(),
                           token_knots: Sequence[int] = PROFILE_TOKEN_KNOTS,
                           holdout_fraction: float = 0.2, seed: int = 0,
                           source: str = "") -> ExecModel:
    """Compose a step-time model from one model's mlp.csv and an attention.csv.

    `attention_csv` may come from another model of the same head size, scaled by
    `attention_scale`; only the token part is then checked (attention checks would
    test the borrowed rows against themselves).
    """
    tokens = load_token_profile(mlp_csv)
    attention = load_attention_profile(attention_csv)
    fit = _fit_attention(attention, holdout_fraction, seed)
    layers = float(num_layers)
    write_ms = float(fit.kv_write[0]) * attention_scale.memory
    write_ms_per_token = float(fit.kv_write[1]) * attention_scale.kv * attention_scale.memory
    train, holdout = split_holdout(len(tokens.num_tokens), holdout_fraction, seed)
    token_ms = (layers * (tokens.layer_ms + write_ms + write_ms_per_token * tokens.num_tokens)
                + tokens.step_ms)
    token_coef = fit_linear(_token_features(tokens.num_tokens[train], token_knots),
                            token_ms[train])
    borrowed = attention_scale != AttentionScale()
    # Attention metrics describe the profiled model; skip them for borrowed rows.
    metrics = {} if borrowed else dict(fit.metrics)
    metrics |= _metrics("token_part", token_ms[holdout],
                        _token_features(tokens.num_tokens[holdout], token_knots) @ token_coef)
    model = ExecModel(name=name, token_knots=tuple(token_knots),
                      coefficients_ms=_compose(token_coef, fit, layers, attention_scale,
                                               token_knots),
                      metrics=metrics, source=source)
    if borrowed:
        return model
    _, holdout_rows = split_holdout(len(attention.attention_ms), holdout_fraction, seed)
    step = _step_metrics(model, tokens, attention.subset(holdout_rows), layers, seed)
    return replace(model, metrics=metrics | step)


def _compose(token_coef: np.ndarray, fit: _AttentionFit, layers: float, scale: AttentionScale,
             token_knots: Sequence[int]) -> dict[str, float]:
    names = feature_names(token_knots)
    values = dict(zip(names, token_coef.tolist(), strict=False))  # token features lead
    # NOTE: decode attention's fixed cost joins the constant: almost every step decodes.
    decode, prefill = layers * scale.memory, layers * scale.compute
    values["const"] += decode * float(fit.decode[0])
    values["num_decode_seqs"] = decode * float(fit.decode[1])
    values["decode_context_tokens"] = decode * float(fit.decode[2]) * scale.kv
    values["num_prefill_seqs"] = prefill * float(fit.prefill[0])
    values["prefill_chunk_x_context"] = prefill * float(fit.prefill[1]) * scale.prefill
    values["prefill_chunk_sq"] = prefill * float(fit.prefill[2]) * scale.prefill
    return values


def _step_metrics(model: ExecModel, tokens: TokenProfile, held_out: AttentionProfile,
                  layers: float, seed: int) -> dict[str, float]:
    """Model vs measured composition on steps built from held-out attention rows.

    Each held-out row is a step on its own (a decode batch or one prefill chunk),
    and decode rows are also paired at random with prefill rows into mixed steps.
    """
    decode = held_out.subset(np.flatnonzero(~held_out.is_prefill))
    prefill = held_out.subset(np.flatnonzero(held_out.is_prefill))
    num_decode, num_prefill = len(decode.attention_ms), len(prefill.attention_ms)
    rng = np.random.default_rng(seed)
    num_pairs = min(num_decode, num_prefill)
    combos = ([(d, None) for d in range(num_decode)] + [(None, p) for p in range(num_prefill)]
              + list(zip(rng.permutation(num_decode)[:num_pairs].tolist(),
                         rng.permutation(num_prefill)[:num_pairs].tolist(), strict=True)))
    measured, predicted = [], []
    for d, p in combos:
        stats, attention_ms = _held_out_step(decode, prefill, d, p)
        layer_ms, step_ms = tokens.interpolate(stats.num_tokens)
        measured.append(layers * (float(layer_ms) + attention_ms) + float(step_ms))
        predicted.append(model.step_ms(stats))
    return _metrics("step", np.array(measured), np.array(predicted))


def _held_out_step(decode: AttentionProfile, prefill: AttentionProfile, d: int | None,
                   p: int | None) -> tuple[BatchStats, float]:
    """The batch of decode row `d` and/or prefill row `p`, and its measured attention ms."""
    stats, attention_ms = BatchStats(), 0.0
    if d is not None:
        size, kv = int(decode.batch_size[d]), int(decode.kv_cache_size[d])
        stats += BatchStats(num_decode_seqs=size, decode_context_tokens=size * kv)
        attention_ms += float(decode.attention_ms[d] + decode.kv_write_ms[d])
    if p is not None:
        chunk, kv = int(prefill.chunk[p]), int(prefill.kv_cache_size[p])
        stats += BatchStats(chunk, 0, 1, 0, chunk * kv, chunk * chunk)
        attention_ms += float(prefill.attention_ms[p] + prefill.kv_write_ms[p])
    return stats, attention_ms
