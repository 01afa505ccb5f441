"""Execution-time model: how long one engine step takes for a given batch composition."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "BatchStats",
    "ExecModel",
    "FORMAT",
    "MODELS_DIR",
    "bundled_model",
    "bundled_model_names",
    "exec_model_of",
    "feature_names",
    "features_of",
    "fit_from_step_samples",
    "fit_linear",
    "fit_metrics",
    "is_exec_model",
    "split_holdout",
    "step_sample",
]

#: Identifies the JSON layout of a saved model.
FORMAT = "blockq.exec_model/1"
#: Hinges of the piecewise-linear token term used when fitting step samples.
DEFAULT_TOKEN_KNOTS: tuple[int, ...] = (128, 512)
#: Where fitted models shipped with the package live.
MODELS_DIR = Path(__file__).resolve().parent / "models"
#: Step-sample keys that feed the optional context features.
CONTEXT_KEYS = ("decode_context_tokens", "prefill_chunk_x_context", "prefill_chunk_sq")
#: Losses of `fit_from_step_samples`.
FIT_LOSSES = ("relative", "time")
#: With the "time" loss, a step over this many times a first (relative) fit's prediction is
#: taken for a stall of the machine (the engine thread held up), not for the batch's cost.
STALL_FACTOR = 3.0


@dataclass(frozen=True, slots=True)
class BatchStats:
    """The composition of one step, as the execution-time model sees it."""

    #: Tokens of prefill chunks (every scheduled chunk that is not a decode).
    num_prefill_tokens: int = 0
    #: Decodes: one-token chunks at the end of a sequence.
    num_decode_seqs: int = 0
    #: Sequences with a prefill chunk.
    num_prefill_seqs: int = 0
    #: Sum over decodes of the tokens they attend to (their whole sequence).
    decode_context_tokens: int = 0
    #: Sum over prefill chunks of chunk length x tokens already cached before it.
    prefill_chunk_x_context: int = 0
    #: Sum over prefill chunks of chunk length squared (attention within the chunk).
    prefill_chunk_sq: int = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs

    @property
    def num_seqs(self) -> int:
        return self.num_decode_seqs + self.num_prefill_seqs

    @staticmethod
    def of_chunk(num_new_tokens: int, num_computed_before: int, num_tokens: int) -> BatchStats:
        """The contribution of one scheduled chunk."""
        return BatchStats.of_chunks(((num_new_tokens, num_computed_before, num_tokens),))

    @staticmethod
    def of_chunks(chunks: Iterable[tuple[int, int, int]]) -> BatchStats:
        """A step's composition from its chunks: (new tokens, computed before, sequence tokens).

        A decode is a one-token chunk at the end of its sequence; every other chunk is a
        prefill. NOTE: summed on plain ints, not `+` on stats: a step scheduler calls this
        once per step with up to ``max_num_seqs`` chunks.
        """
        num_prefill_tokens = num_decode_seqs = num_prefill_seqs = 0
        decode_context_tokens = prefill_chunk_x_context = prefill_chunk_sq = 0
        for num_new, num_computed, num_tokens in chunks:
            if num_new == 1 and num_computed == num_tokens - 1:
                num_decode_seqs += 1
                decode_context_tokens += num_tokens
            else:
                num_prefill_tokens += num_new
                num_prefill_seqs += 1
                prefill_chunk_x_context += num_new * num_computed
                prefill_chunk_sq += num_new * num_new
        return BatchStats(num_prefill_tokens, num_decode_seqs, num_prefill_seqs,
                          decode_context_tokens, prefill_chunk_x_context, prefill_chunk_sq)

    def __add__(self, other: BatchStats) -> BatchStats:
        return BatchStats(*(a + b for a, b in zip(_astuple(self), _astuple(other))))

    def __sub__(self, other: BatchStats) -> BatchStats:
        return BatchStats(*(a - b for a, b in zip(_astuple(self), _astuple(other))))


def _astuple(stats: BatchStats) -> tuple[int, ...]:
    return (stats.num_prefill_tokens, stats.num_decode_seqs, stats.num_prefill_seqs,
            stats.decode_context_tokens, stats.prefill_chunk_x_context, stats.prefill_chunk_sq)


def feature_names(token_knots: Sequence[int]) -> tuple[str, ...]:
    """Names of the linear model's features, in coefficient order."""
    hinges = tuple(f"num_tokens_over_{k}" for k in token_knots)
    return ("const", "num_tokens", *hinges, "num_decode_seqs", "num_prefill_seqs",
            *CONTEXT_KEYS)


def features_of(stats: BatchStats, token_knots: Sequence[int]) -> list[float]:
    """Feature vector of one batch (see `feature_names`)."""
    tokens = stats.num_tokens
    return [1.0, tokens, *(max(0, tokens - k) for k in token_knots),
            stats.num_decode_seqs, stats.num_prefill_seqs, stats.decode_context_tokens,
            stats.prefill_chunk_x_context, stats.prefill_chunk_sq]


@dataclass(frozen=True, slots=True)
class ExecModel:
    """Step duration in ms, linear in batch features with a piecewise-linear token term.

    ``step_ms = const + a*tokens + sum_k b_k*max(0, tokens - k) + c*decodes
    + d*prefills + e*decode_context + f*prefill_chunk_x_context + g*prefill_chunk_sq``.

    Decode context enters linearly, so a run of decode-only steps whose sequences
    each grow by one token per step sums in closed form (`sum_decode_steps_ms`).
    An empty step takes no time.
    """

    #: Short label, e.g. ``"qwen2-7b-a30"``.
    name: str
    #: Token counts where the token term changes slope.
    token_knots: tuple[int, ...]
    #: Milliseconds per unit of each feature, by feature name.
    coefficients_ms: Mapping[str, float]
    #: Fit quality (R^2, MAPE on training and held-out data, sample counts).
    metrics: Mapping[str, float] = field(default_factory=dict)
    #: Where the fit came from, in words.
    source: str = ""
    _coef: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _decode_base_ms: list[float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = feature_names(self.token_knots)
        unknown = set(self.coefficients_ms) - set(names)
        if unknown:
            raise ValueError(f"unknown features {sorted(unknown)}; known: {list(names)}")
        object.__setattr__(self, "token_knots", tuple(int(k) for k in self.token_knots))
        object.__setattr__(self, "_coef",
                           tuple(float(self.coefficients_ms.get(n, 0.0)) for n in names))
        object.__setattr__(self, "_decode_base_ms", [0.0])

    # -- prediction -----------------------------------------------------------------
    def step_ms(self, stats: BatchStats) -> float:
        """Duration of one step with this composition."""
        return self.step_ms_of(stats.num_prefill_tokens, stats.num_decode_seqs,
                               stats.num_prefill_seqs, stats.decode_context_tokens,
                               stats.prefill_chunk_x_context, stats.prefill_chunk_sq)

    def step_ms_of(self, num_prefill_tokens: int, num_decode_seqs: int, num_prefill_seqs: int,
                   decode_context_tokens: int, prefill_chunk_x_context: int,
                   prefill_chunk_sq: int) -> float:
        """`step_ms` on loose numbers (the simulator's hot path avoids building stats)."""
        tokens = num_prefill_tokens + num_decode_seqs
        if tokens <= 0:
            return 0.0
        coef = self._coef
        total = coef[0] + coef[1] * tokens
        index = 2
        for knot in self.token_knots:
            if tokens > knot:
                total += coef[index] * (tokens - knot)
            index += 1
        return (total + coef[index] * num_decode_seqs + coef[index + 1] * num_prefill_seqs
                + coef[index + 2] * decode_context_tokens
                + coef[index + 3] * prefill_chunk_x_context
                + coef[index + 4] * prefill_chunk_sq)

    @property
    def decode_context_ms(self) -> float:
        """Milliseconds per token of decode context (the slope `sum_decode_steps_ms` uses)."""
        return self._coef[-3]

    def decode_base_ms(self, num_decode_seqs: int) -> float:
        """Duration of a decode-only step with this many decodes and no context."""
        cache = self._decode_base_ms
        while len(cache) <= num_decode_seqs:
            cache.append(self.step_ms_of(0, len(cache), 0, 0, 0, 0))
        return cache[num_decode_seqs]

    def sum_decode_steps_ms(self, num_decode_seqs: int, context_tokens: int,
                            num_steps: int) -> float:
        """Total duration of `num_steps` decode-only steps.

        The first step attends `context_tokens`; each step adds one token to each
        of the `num_decode_seqs` sequences, so context grows arithmetically.
        """
        if num_steps <= 0 or num_decode_seqs <= 0:
            return 0.0
        growth = num_decode_seqs * num_steps * (num_steps - 1) // 2
        return (num_steps * self.decode_base_ms(num_decode_seqs)
                + self.decode_context_ms * (num_steps * context_tokens + growth))

    # -- persistence ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "token_knots": list(self.token_knots),
            "coefficients_ms": {n: c for n, c in zip(feature_names(self.token_knots), self._coef)},
            "metrics": dict(self.metrics),
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExecModel:
        if data.get("format") != FORMAT:
            raise ValueError(f"not an execution-time model (format {data.get('format')!r}, "
                             f"expected {FORMAT!r})")
        return cls(name=str(data["name"]), token_knots=tuple(data["token_knots"]),
                   coefficients_ms=dict(data["coefficients_ms"]),
                   metrics=dict(data.get("metrics", {})), source=str(data.get("source", "")))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ExecModel:
        return cls.from_dict(json.loads(Path(path).read_text()))


def bundled_model_names() -> list[str]:
    """Names of the fitted models shipped in ``workers/sim/models``."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def bundled_model(name: str) -> ExecModel:
    """Load a shipped model by name, e.g. ``"qwen2-7b-a30"``."""
    path = MODELS_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"no bundled execution-time model {name!r}; "
                         f"known: {bundled_model_names()}")
    return ExecModel.load(path)


def is_exec_model(name: str) -> bool:
    """Whether `name` is a shipped model's name or the path of a model file (``.json``)."""
    return name in bundled_model_names() or (name.endswith(".json") and Path(name).is_file())


def exec_model_of(name: str) -> ExecModel:
    """A shipped model by name, or a model file by its path: the step times of a GPU kind
    derived from its datasheet, as ``blockq plan --fleet-out`` writes them beside the fleet."""
    if name.endswith(".json") and name not in bundled_model_names():
        if not Path(name).is_file():
            raise ValueError(f"no execution-time model file {name!r}")
        return ExecModel.load(name)
    return bundled_model(name)


# -- fitting ------------------------------------------------------------------------
def fit_linear(x: np.ndarray, y: np.ndarray, relative: bool = True) -> np.ndarray:
    """Least-squares coefficients; `relative` minimises squared relative error.

    All-zero columns get coefficient 0 (nothing to learn from them).
    """
    used = np.any(x != 0, axis=0)
    weights = 1.0 / np.maximum(np.abs(y), 1e-9) if relative else np.ones_like(y)
    xw = x[:, used] * weights[:, None]
    scale = np.maximum(np.abs(xw).max(axis=0), 1e-30)
    solution, *_ = np.linalg.lstsq(xw / scale, y * weights, rcond=None)
    coef = np.zeros(x.shape[1])
    coef[used] = solution / scale
    return coef


def fit_metrics(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """R^2 and mean absolute percentage error (as a fraction)."""
    residual = float(np.sum((y_true - y_pred) ** 2))
    total = float(np.sum((y_true - np.mean(y_true)) ** 2))
    r2 = 1.0 - residual / total if total > 0 else (1.0 if residual == 0 else 0.0)
    mape = float(np.mean(np.abs(y_pred - y_true) / np.maximum(np.abs(y_true), 1e-9)))
    return {"r2": r2, "mape": mape}


def split_holdout(num_rows: int, holdout_fraction: float,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and held-out row indices, drawn with a fixed seed."""
    order = np.random.default_rng(seed).permutation(num_rows)
    num_holdout = int(round(num_rows * holdout_fraction)) if num_rows >= 10 else 0
    return np.sort(order[num_holdout:]), np.sort(order[:num_holdout])


def step_sample(stats: BatchStats, duration_ms: float) -> dict[str, float]:
    """One measured step in the form `fit_from_step_samples` reads (and workers record)."""
    return {"duration_ms": duration_ms, "num_seqs": stats.num_seqs,
            "num_prefill_tokens": stats.num_prefill_tokens,
            "num_decode_tokens": stats.num_decode_seqs,
            "decode_context_tokens": stats.decode_context_tokens,
            "prefill_chunk_x_context": stats.prefill_chunk_x_context,
            "prefill_chunk_sq": stats.prefill_chunk_sq}


def _stats_of_sample(sample: Mapping[str, float]) -> BatchStats:
    num_decode = int(sample["num_decode_tokens"])
    return BatchStats(
        num_prefill_tokens=int(sample["num_prefill_tokens"]),
        num_decode_seqs=num_decode,
        num_prefill_seqs=max(int(sample["num_seqs"]) - num_decode, 0),
        decode_context_tokens=int(sample.get("decode_context_tokens", 0)),
        prefill_chunk_x_context=int(sample.get("prefill_chunk_x_context", 0)),
        prefill_chunk_sq=int(sample.get("prefill_chunk_sq", 0)),
    )


def fit_from_step_samples(samples: Iterable[Mapping[str, float]], *,
                          token_knots: Sequence[int] = DEFAULT_TOKEN_KNOTS,
                          holdout_fraction: float = 0.2, seed: int = 0,
                          name: str = "step-samples", source: str = "",
                          loss: str = "relative") -> ExecModel:
    """Fit an `ExecModel` to measured engine steps.

    Each sample has ``duration_ms, num_seqs, num_prefill_tokens, num_decode_tokens``
    and optionally the context features ``decode_context_tokens`` (sum of sequence
    lengths over decodes), ``prefill_chunk_x_context`` and ``prefill_chunk_sq`` (see
    `BatchStats`). Features no sample carries get coefficient 0. A seeded share of
    the samples is held out; the metrics report both parts and the model is the
    fit on the rest.

    `loss` "relative" minimises squared relative error: every step counts alike, so the
    typical step is priced well, but with skewed step times the modelled steps add up to
    less than the measured ones (docs/measurements.md). "time" refits with
    absolute squared error on the steps the relative fit does not see as stalls (over
    `STALL_FACTOR` x its prediction): with the constant term, modelled and measured step
    times then sum to the same over the kept steps, which is what latencies add up.
    """
    if loss not in FIT_LOSSES:
        raise ValueError(f"unknown loss {loss!r}; known: {FIT_LOSSES}")
    rows = list(samples)
    if not rows:
        raise ValueError("no step samples to fit")
    x = np.array([features_of(_stats_of_sample(s), token_knots) for s in rows], dtype=float)
    y = np.array([float(s["duration_ms"]) for s in rows])
    train, holdout = split_holdout(len(rows), holdout_fraction, seed)
    coef = fit_linear(x[train], y[train])
    if loss == "time":
        kept = train[y[train] <= STALL_FACTOR * (x[train] @ coef)]
        coef = fit_linear(x[kept], y[kept], relative=False)
    metrics = _split_metrics(x, y, coef, train, holdout)
    names = feature_names(token_knots)
    return ExecModel(name=name, token_knots=tuple(token_knots),
                     coefficients_ms=dict(zip(names, coef.tolist())), metrics=metrics,
                     source=source or f"fit to {len(rows)} engine step samples")


def evaluate_on_step_samples(model: ExecModel, samples: Iterable[Mapping[str, float]]
                             ) -> dict[str, float]:
    """How well `model` predicts measured steps (same metrics as the fit's)."""
    rows = list(samples)
    if not rows:
        raise ValueError("no step samples to evaluate on")
    predicted = np.array([model.step_ms(_stats_of_sample(s)) for s in rows])
    return fit_metrics(np.array([float(s["duration_ms"]) for s in rows]), predicted)


def _split_metrics(x: np.ndarray, y: np.ndarray, coef: np.ndarray, train: np.ndarray,
                   holdout: np.ndarray) -> dict[str, float]:
    metrics: dict[str, float] = {"num_train": float(len(train)),
                                 "num_holdout": float(len(holdout))}
    for label, index in (("train", train), ("holdout", holdout)):
        if len(index):
            for key, value in fit_metrics(y[index], x[index] @ coef).items():
                metrics[f"{key}_{label}"] = value
    return metrics
