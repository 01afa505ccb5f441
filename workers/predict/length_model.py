"""The learned output-length predictor: encoder embedding + cheap features -> log output tokens.

Shape of the model::

    prompt --Encoder--> embedding (6 MiniLM layers, mean-pooled)  ┐
    prompt --features.extract--> 27 cheap features (z-scored)    ├─ ridge ─> log tokens
    serving model --> its own intercept (fixed effect)           ┘    + residual quantile -> p90

The head is a linear model on log output tokens with a ridge penalty and one unpenalised
intercept per serving model, fitted with absolute error by default (a median: what the error in
tokens rewards; `TrainConfig.loss`): the prompt says how long an answer tends to be, the model
says how verbose it is. A model
the head has never seen gets the row-weighted mean intercept (`LengthPrediction.model_known` is
False). The uncertainty is the 90th percentile of out-of-fold log residuals (per model where it
has enough rows), so p90 = point x exp(q90) is calibrated on prompts the head did not train on.
Predictions are clipped to [1, max_tokens].

Inference is numpy on top of the encoder; `train` is what the offline script and the online
retraining loop call. The artifact is one small ``.npz`` (weights and a JSON metadata entry with
the metrics), `to_bytes`/`from_bytes` for a registry row.

The online loop (`workers/learn`) adds to a head one `ModelCorrection` per serving model it has
learned from that model's own history: a shift, a scale of the log point and a small weight
vector on the same inputs, all fitted on the residuals of the shared head and shrunk by how much
history there was. Applying one costs a dot product per row on inputs the head computes anyway.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from threadpoolctl import ThreadpoolController, threadpool_limits

from workers.predict.effects import EffectsConfig, fit_effects, neighbour_effect, unit_rows
from workers.predict.encoder import DEFAULT_ENCODER, Encoder, EncoderConfig
from workers.predict.features import (
    FEATURE_NAMES,
    Prompt,
    TokenCounter,
    embedding_text,
    extract,
    full_text,
)
from workers.predict.static_encoder import (
    STATIC_ARTIFACT,
    STATIC_ENCODER,
    StaticEncoder,
    StaticEncoderConfig,
)

#: Either encoder: both embed texts into unit-norm rows and carry a name and a dim.
AnyEncoder = Encoder | StaticEncoder

__all__ = [
    "BOOTSTRAP_ARTIFACT",
    "ENCODER_KINDS",
    "HEAD_PATHS",
    "STATIC_BOOTSTRAP_ARTIFACT",
    "AnyEncoder",
    "bootstrap_artifact",
    "build_encoder",
    "default_encoder",
    "default_encoder_kind",
    "fit_effects_head",
    "Design",
    "LengthHead",
    "LengthPrediction",
    "LengthPredictor",
    "ModelCorrection",
    "TrainConfig",
    "design_matrix",
    "encoder_config_for",
    "encoder_info",
    "evaluate",
    "fit_head",
    "head_artifact",
    "length_metrics",
    "make_encoder",
    "minilm_encoder",
    "predict",
    "static_sibling",
    "train",
]

#: The heads shipped with the package, trained on the many-models lengths
#: (scripts/train_length_model.py): on MiniLM (the accurate one) and on the static encoder.
BOOTSTRAP_ARTIFACT = Path(__file__).resolve().parent / "models" / "length_bootstrap.npz"
STATIC_BOOTSTRAP_ARTIFACT = BOOTSTRAP_ARTIFACT.with_name("length_bootstrap_static.npz")
#: Encoders a head can be trained on by name ("auto": `default_encoder_kind`).
ENCODER_KINDS = ("auto", "minilm", "static")
ARTIFACT_FORMAT = 4
#: Formats `LengthHead.from_bytes` reads (1: no per-model corrections; 2: no effects fit;
#: 3: no neighbours).
_READABLE_FORMATS = (1, 2, 3, 4)


def _distinct_rows(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of `matrix` and, per row, the index of its distinct row: a batch
    repeats a prompt once per serving model, and its neighbours are looked up once.

    NOTE: each row compared as one opaque value; `np.unique(axis=0)` builds a structured dtype
    with a field per column, costly on MiniLM's 2,304 columns (docs/measurements.md).
    """
    rows = np.ascontiguousarray(matrix)
    keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return rows[first], inverse.reshape(-1)


@functools.cache
def _thread_pools() -> ThreadpoolController:
    """The process's native thread pools, found once: `threadpool_limits` scans the loaded
    libraries on every call, too slow for each prediction (docs/measurements.md)."""
    return ThreadpoolController()


@dataclass(frozen=True, slots=True)
class LengthPrediction:
    """One predicted output length; what the predict task records and the router reads."""

    tokens: int         # point estimate (median), 1 <= tokens <= max_tokens
    p90_tokens: int     # 90th percentile: tokens <= p90_tokens <= max_tokens
    model_known: bool   # False when the serving model was not in the training data


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """How `train` chooses and fits the head."""

    #: Ridge penalties tried by grouped cross-validation (the best out-of-fold MAE wins);
    #: None: the method's defaults (`penalties`).
    alphas: tuple[float, ...] | None = None
    #: Folds of the grouped cross-validation (groups = prompts); fewer if there are few prompts.
    num_folds: int = 5
    #: Quantile reported as the uncertainty.
    quantile: float = 0.9
    #: Rows a serving model needs for its own residual quantile (else the pooled one).
    min_rows_per_model_quantile: int = 30
    #: Per-dimension scale of the unit-norm embedding blocks relative to z-scored features.
    #: NOTE: 0.25 with 384-dim MiniLM blocks, i.e. each block has norm sqrt(384) / 4.
    embedding_weight: float = 0.25
    #: Cap applied to predictions when scoring (the longest answers in the bootstrap data).
    max_tokens: int = 4096
    seed: int = 0
    #: "absolute": the head fits the median of log tokens (ridge penalty, absolute error, by
    #: iteratively reweighted least squares), what the error in tokens rewards; "squared": plain
    #: ridge on log tokens (their mean). Either way the point is then shifted by the median
    #: out-of-fold residual.
    #: NOTE: absolute error lowered the cross-validated MAE on the bootstrap data
    #: (docs/measurements.md); it only changes training, not the cost of a prediction.
    loss: str = "absolute"
    #: Reweighting rounds of the absolute loss (one weighted ridge solve per penalty each).
    irls_iterations: int = 3
    #: "effects" (default): model effect + prompt effect + interactions, fitted on many answers
    #: per prompt (`workers.predict.effects`); "ridge": the per-answer ridge head of `fit_head`.
    method: str = "effects"
    #: The effects fit's other settings (its penalties are `penalties`, its folds `num_folds`).
    effects: EffectsConfig = EffectsConfig()

    def __post_init__(self) -> None:
        if self.loss not in ("absolute", "squared"):
            raise ValueError(f"loss must be 'absolute' or 'squared', got {self.loss!r}")
        if self.irls_iterations < 0:
            raise ValueError(f"irls_iterations must be >= 0, got {self.irls_iterations}")
        if self.method not in ("effects", "ridge"):
            raise ValueError(f"method must be 'effects' or 'ridge', got {self.method!r}")

    @property
    def penalties(self) -> tuple[float, ...]:
        if self.alphas is not None:
            return tuple(self.alphas)
        # NOTE: "ridge" penalises per answer row, "effects" per prompt (one row each).
        return (30.0, 100.0, 300.0, 1000.0, 3000.0) if self.method == "ridge" else (
            1.0, 3.0, 10.0, 30.0, 100.0, 300.0)


@dataclass(frozen=True, slots=True)
class Design:
    """The head's inputs for a set of rows (one row per (prompt, serving model) pair)."""

    embeddings: np.ndarray    # (n, encoder dim) float32, unit-norm per pooled layer
    features: np.ndarray      # (n, len(FEATURE_NAMES)) float32, raw (not yet z-scored)
    models: tuple[str, ...]   # serving model of each row

    def __post_init__(self) -> None:
        n = len(self.models)
        assert self.embeddings.shape[0] == n and self.features.shape[0] == n, "ragged Design"

    def take(self, index: np.ndarray) -> Design:
        return Design(self.embeddings[index], self.features[index],
                      tuple(self.models[i] for i in index))


def design_matrix(prompts: Sequence[Prompt], models: Sequence[str], *, encoder: Encoder,
                  counter: TokenCounter) -> Design:
    """Embed and featurise each distinct prompt once, then lay the rows out."""
    if len(prompts) != len(models):
        raise ValueError(f"{len(prompts)} prompts but {len(models)} models")
    keys = [full_text(p) for p in prompts]
    first: dict[str, int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    unique = list(first.values())
    embeddings = encoder.embed([embedding_text(prompts[i]) for i in unique])
    features = np.stack([extract(prompts[i], num_prompt_tokens=counter(keys[i]))
                         for i in unique]) if unique else np.zeros((0, len(FEATURE_NAMES)))
    slot = {key: k for k, key in enumerate(first)}
    rows = np.array([slot[key] for key in keys], dtype=np.int64)
    return Design(embeddings[rows], features[rows].astype(np.float32), tuple(models))


@dataclass(frozen=True)
class ModelCorrection:
    """A serving model's own correction of the shared head, learned online from its history.

    On the head's log point z of that model's rows (its intercept included) the corrected point
    is ``z + intercept + slope * (z - center) + inputs @ weights``.
    """

    intercept: float                 # log tokens added (already shrunk towards 0)
    slope: float = 0.0               # added to the coefficient of the head's own log point
    center: float = 0.0              # the head's mean log point on the rows it was fitted on
    weights: np.ndarray | None = None  # (num inputs,) on the head's scaled inputs, or None
    log_q: float | None = None       # upper residual quantile of the corrected point, or None
    rows: int = 0                    # history rows it was fitted on
    through: str = ""                # newest history row it saw (ISO time or row label)
    penalty: float | None = None     # ridge penalty of `weights` chosen by time-ordered CV

    def apply(self, log_point: np.ndarray, inputs: np.ndarray) -> np.ndarray:
        shifted = log_point + self.intercept + self.slope * (log_point - self.center)
        return shifted if self.weights is None else shifted + inputs @ self.weights

    def to_meta(self) -> dict:
        return {"intercept": self.intercept, "slope": self.slope, "center": self.center,
                "log_q": self.log_q, "rows": self.rows, "through": self.through,
                "penalty": self.penalty, "has_weights": self.weights is not None}

    @classmethod
    def from_meta(cls, meta: Mapping, weights: np.ndarray | None) -> ModelCorrection:
        return cls(intercept=float(meta["intercept"]), slope=float(meta["slope"]),
                   center=float(meta["center"]), weights=weights,
                   log_q=None if meta.get("log_q") is None else float(meta["log_q"]),
                   rows=int(meta.get("rows", 0)), through=str(meta.get("through", "")),
                   penalty=None if meta.get("penalty") is None else float(meta["penalty"]))


@dataclass(frozen=True)
class LengthHead:
    """The trained regression head and everything needed to apply it (numpy only)."""

    weights: np.ndarray                 # (encoder dim + num features,) on the scaled inputs
    feature_mean: np.ndarray            # z-scoring of the features
    feature_scale: np.ndarray
    embedding_scale: float              # multiplies the embedding block
    model_names: tuple[str, ...]        # serving models with their own intercept
    model_intercepts: np.ndarray        # (num models,) log tokens
    pooled_intercept: float             # for serving models not in `model_names`
    model_log_q: np.ndarray             # (num models,) residual quantile in log space
    pooled_log_q: float
    log_offset: float                   # median out-of-fold residual: makes the point a median
    quantile: float
    feature_names: tuple[str, ...]
    encoder: dict                       # name, dim, max_seq_len, layers, tail_share, num_layers
    metrics: dict = field(default_factory=dict)
    version: str = ""                   # content hash, set on fit
    trained_at: str = ""                # UTC ISO timestamp
    #: Per-serving-model corrections learned online (`workers.learn`), applied after the head.
    corrections: Mapping[str, ModelCorrection] = field(default_factory=dict)
    #: Effects fit (`workers.predict.effects`, format 3): each model's sensitivity to the prompt
    #: effect (None: 1 for every model), the prompt effect's bias, and the reduced-rank
    #: interaction: (inputs @ factor_weights) . model_factors[model].
    model_scales: np.ndarray | None = None
    pooled_scale: float = 1.0
    prompt_bias: float = 0.0
    factor_weights: np.ndarray | None = None    # (num inputs, rank)
    model_factors: np.ndarray | None = None     # (num models, rank)
    #: Answers of a new serving model that weigh as much as the population prior of its effect
    #: (noise variance of one answer over the variance of model effects); None: not estimated.
    prior_rows: float | None = None
    #: Where the training rows came from and under which licence: [{"name", "licence", "rows"}].
    sources: tuple[Mapping[str, object], ...] = ()
    #: Nearest-neighbour part of the prompt effect (format 4; None: none): the training prompts'
    #: embeddings (float16 in the artifact) and their prompt effects (already times the blend's
    #: share), added to the prompt effect as `effects.neighbour_effect` of the row's embedding.
    neighbour_embeddings: np.ndarray | None = None    # (num anchors, encoder dim)
    neighbour_effects: np.ndarray | None = None       # (num anchors,)
    neighbours: int = 0
    neighbour_temperature: float = 1.0

    def __post_init__(self) -> None:
        if tuple(self.feature_names) != FEATURE_NAMES:
            raise ValueError("artifact was trained on other features than features.FEATURE_NAMES"
                             "; retrain it with scripts/train_length_model.py")

    @property
    def name(self) -> str:
        return f"length_model:{self.version}"

    def _inputs(self, design: Design) -> np.ndarray:
        features = (design.features - self.feature_mean) / self.feature_scale
        return np.hstack([design.embeddings * self.embedding_scale, features])

    def inputs(self, design: Design) -> np.ndarray:
        """The scaled inputs the weights (and the corrections' weights) apply to."""
        return self._inputs(design)

    def predict_log(self, design: Design, *, corrected: bool = True
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(log point, log upper quantile, model known) per row; no clipping.

        `corrected=False` leaves out the per-model corrections (what they were fitted on).
        """
        index = {name: i for i, name in enumerate(self.model_names)}
        slots = np.array([index.get(m, -1) for m in design.models], dtype=np.int64)
        known = slots >= 0
        safe = np.maximum(slots, 0)
        intercept = np.where(known, self.model_intercepts[safe], self.pooled_intercept)
        log_q = np.where(known, self.model_log_q[safe], self.pooled_log_q)
        inputs = self._inputs(design)
        prompt = inputs @ self.weights + self.prompt_bias + self._borrowed(design.embeddings)
        if self.model_scales is not None:
            prompt = prompt * np.where(known, self.model_scales[safe], self.pooled_scale)
        log_point = prompt + intercept + self.log_offset
        if self.factor_weights is not None and self.factor_weights.shape[1]:
            loadings = np.where(known[:, None], self.model_factors[safe], 0.0)
            log_point = log_point + ((inputs @ self.factor_weights) * loadings).sum(1)
        if corrected and self.corrections:
            models = np.asarray(design.models, dtype=object)
            for model, correction in self.corrections.items():
                rows = models == model
                if not rows.any():
                    continue
                log_point[rows] = correction.apply(log_point[rows], inputs[rows])
                if correction.log_q is not None:
                    log_q[rows] = correction.log_q
        return log_point, log_point + np.maximum(log_q, 0.0), known

    def _borrowed(self, embeddings: np.ndarray) -> np.ndarray | float:
        """The neighbours' part of each row's prompt effect (0.0 without neighbours)."""
        if self.neighbour_embeddings is None or not len(embeddings):
            return 0.0
        distinct, rows = _distinct_rows(embeddings)
        # NOTE: one BLAS thread: OpenBLAS threads the (prompts x anchors) product, and its
        # threads then spin on the other core while the encoder runs, which doubled the CPU of
        # a batched prediction (docs/measurements.md).
        with _thread_pools().limit(limits=1, user_api="blas"):
            borrowed = neighbour_effect(distinct, self._unit_anchors, self.neighbour_effects,
                                        neighbours=self.neighbours,
                                        temperature=self.neighbour_temperature,
                                        unit_anchors=True)
        return borrowed[rows]

    @functools.cached_property
    def _unit_anchors(self) -> np.ndarray:
        """The neighbours' embeddings scaled to unit rows, once per head."""
        return unit_rows(self.neighbour_embeddings)

    def with_correction(self, model: str, correction: ModelCorrection | None) -> LengthHead:
        """This head with `model`'s correction replaced (None: removed); a new version."""
        corrections = {m: c for m, c in self.corrections.items() if m != model}
        if correction is not None:
            corrections[model] = correction
        digest = hashlib.sha1(self.version.encode())
        for name in sorted(corrections):
            c = corrections[name]
            digest.update(json.dumps([name, c.to_meta()], sort_keys=True, default=str).encode())
            if c.weights is not None:
                digest.update(np.asarray(c.weights, dtype=np.float32).tobytes())
        version = digest.hexdigest()[:12] if corrections else self._base_version()
        return replace(self, corrections=corrections, version=version,
                       metrics={**self.metrics, "base_version": self._base_version()})

    def _base_version(self) -> str:
        return str(self.metrics.get("base_version", self.version))

    def predict(self, design: Design, max_tokens: np.ndarray | int
                ) -> list[LengthPrediction]:
        log_point, log_upper, known = self.predict_log(design)
        cap = np.broadcast_to(np.asarray(max_tokens, dtype=np.int64), log_point.shape)
        if (cap < 1).any():
            raise ValueError("max_tokens must be >= 1")
        point = _clip_tokens(log_point, cap)
        upper = np.maximum(_clip_tokens(log_upper, cap), point)
        return [LengthPrediction(int(p), int(u), bool(k))
                for p, u, k in zip(point, upper, known, strict=True)]

    # -- artifact ----------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        meta = {
            "format": ARTIFACT_FORMAT,
            "version": self.version,
            "trained_at": self.trained_at,
            "embedding_scale": self.embedding_scale,
            "model_names": list(self.model_names),
            "pooled_intercept": self.pooled_intercept,
            "pooled_log_q": self.pooled_log_q,
            "log_offset": self.log_offset,
            "quantile": self.quantile,
            "feature_names": list(self.feature_names),
            "encoder": self.encoder,
            "metrics": self.metrics,
            "corrections": {m: c.to_meta() for m, c in self.corrections.items()},
            "pooled_scale": self.pooled_scale,
            "prompt_bias": self.prompt_bias,
            "prior_rows": self.prior_rows,
            "sources": [dict(source) for source in self.sources],
            "neighbours": self.neighbours,
            "neighbour_temperature": self.neighbour_temperature,
        }
        effects = {name: np.asarray(value, np.float32) for name, value in (
            ("model_scales", self.model_scales), ("factor_weights", self.factor_weights),
            ("model_factors", self.model_factors), ("neighbour_effects", self.neighbour_effects))
            if value is not None}
        if self.neighbour_embeddings is not None:
            effects["neighbour_embeddings"] = np.asarray(self.neighbour_embeddings, np.float16)
        correction_weights = {f"correction_weights_{i}": np.asarray(c.weights, np.float32)
                              for i, c in enumerate(self.corrections.values())
                              if c.weights is not None}
        buffer = io.BytesIO()
        np.savez_compressed(
            buffer,
            meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
            weights=self.weights.astype(np.float32),
            feature_mean=self.feature_mean.astype(np.float32),
            feature_scale=self.feature_scale.astype(np.float32),
            model_intercepts=self.model_intercepts.astype(np.float64),
            model_log_q=self.model_log_q.astype(np.float64),
            **correction_weights,
            **effects,
        )
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> LengthHead:
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            meta = json.loads(arrays["meta"].tobytes().decode())
            if meta.get("format") not in _READABLE_FORMATS:
                raise ValueError(f"unknown length-model artifact format {meta.get('format')!r}")
            corrections = {
                model: ModelCorrection.from_meta(
                    c, arrays[f"correction_weights_{i}"].astype(np.float32)
                    if c.get("has_weights") else None)
                for i, (model, c) in enumerate(meta.get("corrections", {}).items())}
            return cls(
                weights=arrays["weights"].astype(np.float32),
                feature_mean=arrays["feature_mean"],
                feature_scale=arrays["feature_scale"],
                embedding_scale=float(meta["embedding_scale"]),
                model_names=tuple(meta["model_names"]),
                model_intercepts=arrays["model_intercepts"],
                pooled_intercept=float(meta["pooled_intercept"]),
                model_log_q=arrays["model_log_q"],
                pooled_log_q=float(meta["pooled_log_q"]),
                log_offset=float(meta["log_offset"]),
                quantile=float(meta["quantile"]),
                feature_names=tuple(meta["feature_names"]),
                encoder=dict(meta["encoder"]),
                metrics=dict(meta["metrics"]),
                version=str(meta["version"]),
                trained_at=str(meta["trained_at"]),
                corrections=corrections,
                model_scales=_optional(arrays, "model_scales"),
                pooled_scale=float(meta.get("pooled_scale", 1.0)),
                prompt_bias=float(meta.get("prompt_bias", 0.0)),
                factor_weights=_optional(arrays, "factor_weights"),
                model_factors=_optional(arrays, "model_factors"),
                prior_rows=None if meta.get("prior_rows") is None else float(meta["prior_rows"]),
                sources=tuple(meta.get("sources", ())),
                neighbour_embeddings=_optional(arrays, "neighbour_embeddings", np.float32),
                neighbour_effects=_optional(arrays, "neighbour_effects"),
                neighbours=int(meta.get("neighbours", 0)),
                neighbour_temperature=float(meta.get("neighbour_temperature", 1.0)),
            )

    def save(self, path: Path | str) -> Path:
        """Write the ``.npz`` artifact, and a readable ``.json`` copy of its metadata beside it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.to_bytes())
        summary = {"version": self.version, "trained_at": self.trained_at,
                   "sources": [dict(source) for source in self.sources],
                   "quantile": self.quantile, "model_names": list(self.model_names),
                   "encoder": self.encoder, "metrics": self.metrics}
        path.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: Path | str) -> LengthHead:
        return cls.from_bytes(Path(path).read_bytes())


def _optional(arrays, name: str, dtype: type = np.float64) -> np.ndarray | None:
    return arrays[name].astype(dtype) if name in arrays.files else None


def _clip_tokens(log_tokens: np.ndarray, cap: np.ndarray) -> np.ndarray:
    # NOTE: clip in log space first so exp never overflows on a wild extrapolation.
    return np.clip(np.rint(np.exp(np.clip(log_tokens, 0.0, 20.0))), 1, cap).astype(np.int64)


class LengthPredictor:
    """Encoder + token counter + head: the object a predictor worker loads once and keeps."""

    def __init__(self, head: LengthHead, *, encoder: AnyEncoder, counter: TokenCounter) -> None:
        if encoder.dim != head.encoder["dim"] or encoder.name != head.encoder["name"]:
            raise ValueError(
                f"head was trained on {head.encoder['name']} ({head.encoder['dim']} dims), "
                f"not {encoder.name} ({encoder.dim} dims)")
        self.head = head
        self.encoder = encoder
        self.counter = counter

    @property
    def name(self) -> str:
        """What the request records say predicted the length (``length_model:<version>``)."""
        return self.head.name

    @classmethod
    def load(cls, path: Path | str | None = None, *, encoder_path: str | None = None,
             dtype: str = "auto", num_threads: int | None = None,
             batch_size: int = 8) -> LengthPredictor:
        """Load an artifact (default: this CPU's shipped head, `bootstrap_artifact`) and the
        encoder it was trained with.

        A head trained on another encoder needs `encoder_path`: the local directory of that
        transformer, or the file of that static matrix.
        """
        head = LengthHead.load(bootstrap_artifact() if path is None else path)
        if head.encoder.get("kind") == "static":
            encoder = build_encoder(head.encoder, encoder_path)
        else:
            encoder = build_encoder(head.encoder, encoder_path, dtype=dtype,
                                    num_threads=num_threads, batch_size=batch_size)
        return cls(head, encoder=encoder, counter=TokenCounter())

    def with_head(self, head: LengthHead) -> LengthPredictor:
        """The same encoder and counter with another head: a hot reload costs no encoder load.

        A head trained on another encoder (e.g. a registry version from before the static
        encoder shipped) gets its own encoder, loaded here.
        """
        if head.encoder.get("name") == self.encoder.name and head.encoder.get(
                "dim") == self.encoder.dim:
            return LengthPredictor(head, encoder=self.encoder, counter=self.counter)
        runtime = {} if head.encoder.get("kind") == "static" else {"num_threads": 1}
        return LengthPredictor(head, encoder=build_encoder(head.encoder, **runtime),
                               counter=self.counter)

    def predict_batch(self, prompts: Sequence[Prompt], models: Sequence[str] | str,
                      max_tokens: Sequence[int] | int) -> list[LengthPrediction]:
        """Predict many requests at once (one encoder pass over the batch), in input order.

        `models` and `max_tokens` are one value per prompt, or one value for all.
        """
        models = [models] * len(prompts) if isinstance(models, str) else list(models)
        caps = np.asarray(max_tokens, dtype=np.int64)
        if caps.ndim and len(caps) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(caps)} max_tokens")
        if not prompts:
            return []
        design = design_matrix(prompts, models, encoder=self.encoder, counter=self.counter)
        return self.head.predict(design, caps)

    def predict(self, prompt: Prompt, model: str, max_tokens: int) -> LengthPrediction:
        return self.predict_batch([prompt], [model], [max_tokens])[0]

    def predict_tokens(self, prompts: Sequence[Prompt], model_names: Sequence[str] | str,
                       max_tokens: int = 16_384) -> list[int]:
        """Predicted output tokens per prompt, each for its serving model (a name the artifact
        never saw is predicted zero-shot, from the population's model effect)."""
        return [p.tokens for p in self.predict_batch(prompts, model_names, max_tokens)]


@functools.cache
def _shipped() -> LengthPredictor:
    return LengthPredictor.load(bootstrap_artifact(), num_threads=1)


def predict(prompts: Sequence[Prompt], model_names: Sequence[str] | str) -> list[int]:
    """Output tokens of each prompt on its serving model, by the shipped artifact (loaded once
    per process): model name in, tokens out; an unknown name is predicted zero-shot."""
    return _shipped().predict_tokens(prompts, model_names)


def encoder_config_for(head: LengthHead, path: str | None = None, **runtime) -> EncoderConfig:
    """The encoder settings a head was trained with, plus runtime-only knobs (dtype, threads)."""
    info = head.encoder
    num_layers = info.get("num_layers")
    return EncoderConfig(path=path, max_seq_len=int(info["max_seq_len"]),
                         tail_share=float(info["tail_share"]),
                         layers=tuple(int(i) for i in info["layers"]),
                         num_layers=None if num_layers is None else int(num_layers), **runtime)


# -- fitting ------------------------------------------------------------------------------------

def _fold_of_groups(groups: np.ndarray, num_folds: int, seed: int) -> np.ndarray:
    unique = np.unique(groups)
    order = np.random.default_rng(seed).permutation(len(unique))
    fold_of = dict(zip(unique[order], np.arange(len(unique)) % num_folds, strict=True))
    return np.array([fold_of[g] for g in groups], dtype=np.int64)


@dataclass(frozen=True, slots=True)
class _Ridge:
    """Ridge with per-model fixed effects, solved for many penalties at once (eigenbasis)."""

    eigvals: np.ndarray
    eigvecs: np.ndarray
    projected: np.ndarray     # eigvecs.T @ X~.T @ y~
    x_mean: np.ndarray        # (num models, d) per-model mean inputs
    y_mean: np.ndarray        # (num models,)

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, slots: np.ndarray, num_models: int) -> _Ridge:
        x_mean = np.zeros((num_models, x.shape[1]))
        y_mean = np.zeros(num_models)
        for m in range(num_models):
            rows = slots == m
            if rows.any():
                x_mean[m], y_mean[m] = x[rows].mean(0), y[rows].mean()
        xc = x - x_mean[slots]
        yc = y - y_mean[slots]
        eigvals, eigvecs = np.linalg.eigh(xc.T @ xc)
        return cls(eigvals, eigvecs, eigvecs.T @ (xc.T @ yc), x_mean, y_mean)

    def solve(self, alpha: float) -> tuple[np.ndarray, np.ndarray]:
        weights = self.eigvecs @ (self.projected / (np.maximum(self.eigvals, 0.0) + alpha))
        return weights, self.y_mean - self.x_mean @ weights


#: Smallest absolute log residual the reweighting divides by (keeps weights finite).
_IRLS_FLOOR = 0.05


def _weighted_ridge(x: np.ndarray, y: np.ndarray, slots: np.ndarray, num_models: int,
                    alpha: float, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted ridge with an unpenalised intercept per model: (weights, intercepts)."""
    x_mean = np.zeros((num_models, x.shape[1]))
    y_mean = np.zeros(num_models)
    for m in range(num_models):
        rows = slots == m
        if rows.any():
            x_mean[m] = np.average(x[rows], axis=0, weights=weights[rows])
            y_mean[m] = np.average(y[rows], weights=weights[rows])
    xc = x - x_mean[slots]
    yc = y - y_mean[slots]
    gram = xc.T @ (xc * weights[:, None]) + alpha * np.eye(x.shape[1])
    coef = np.linalg.solve(gram, xc.T @ (weights * yc))
    return coef, y_mean - x_mean @ coef


def _fit_path(x: np.ndarray, y: np.ndarray, slots: np.ndarray, num_models: int,
              alphas: Sequence[float], config: TrainConfig
              ) -> list[tuple[np.ndarray, np.ndarray]]:
    """(weights, intercepts) for each penalty, under `config.loss`."""
    ridge = _Ridge.fit(x, y, slots, num_models)
    solutions = [ridge.solve(alpha) for alpha in alphas]
    if config.loss == "squared":
        return solutions
    fitted = []
    for alpha, (coef, intercepts) in zip(alphas, solutions, strict=True):
        for _ in range(config.irls_iterations):
            residuals = np.abs(y - x @ coef - intercepts[slots])
            coef, intercepts = _weighted_ridge(x, y, slots, num_models, alpha,
                                               1.0 / np.maximum(residuals, _IRLS_FLOOR))
        fitted.append((coef, intercepts))
    return fitted


def _out_of_fold(x: np.ndarray, y: np.ndarray, slots: np.ndarray, num_models: int,
                 folds: np.ndarray, alphas: Sequence[float], config: TrainConfig) -> np.ndarray:
    """Log predictions of every row by the heads fitted without its fold, one row per penalty."""
    oof = np.full((len(alphas), len(y)), np.nan)
    for fold in np.unique(folds):
        held = folds == fold
        path = _fit_path(x[~held], y[~held], slots[~held], num_models, alphas, config)
        seen = np.bincount(slots[~held], minlength=num_models).astype(np.float64)
        for a, (weights, intercepts) in enumerate(path):
            # A model absent from this fold's training rows is an unknown model.
            intercepts = np.where(seen > 0, intercepts, _pooled(intercepts, seen))
            oof[a, held] = x[held] @ weights + intercepts[slots[held]]
    return oof


def _row_basis(block: np.ndarray) -> np.ndarray | None:
    """An orthonormal basis (dims, rank) of the rows of `block`, or None if it spans them all.

    NOTE: with fewer distinct prompts than embedding dimensions, the penalised weights of the
    embedding block lie in the span of its rows, so fitting on the coordinates in this basis
    gives the same predictions at a fraction of the cost (projected back for the artifact).
    """
    unique = np.unique(block, axis=0)
    if len(unique) >= block.shape[1]:
        return None
    _, singular, vt = np.linalg.svd(unique, full_matrices=False)
    return vt[singular > 1e-8 * singular[0]].T


def fit_head(design: Design, output_tokens: Sequence[int] | np.ndarray,
             groups: Sequence[str] | np.ndarray, *, encoder_info: Mapping,
             config: TrainConfig = TrainConfig()) -> tuple[LengthHead, dict]:
    """Fit the head on precomputed inputs; returns it and its out-of-fold metrics.

    `groups` (the prompt ids) keep every answer to a prompt in the same fold, so the metrics
    are on prompts the head did not see. `encoder_info` is recorded in the artifact.
    """
    y_tokens = np.asarray(output_tokens, dtype=np.float64)
    groups = np.asarray(groups)
    if len(y_tokens) < 2 or len(y_tokens) != len(design.models) or len(groups) != len(y_tokens):
        raise ValueError("fit_head needs >= 2 rows and one output length and group per row")
    if (y_tokens < 1).any():
        raise ValueError("output_tokens must be >= 1")
    y = np.log(y_tokens)
    model_names = tuple(sorted(set(design.models)))
    slots = np.array([model_names.index(m) for m in design.models], dtype=np.int64)
    counts = np.bincount(slots, minlength=len(model_names)).astype(np.float64)

    feature_mean = design.features.mean(0)
    feature_scale = design.features.std(0)
    feature_scale = np.where(feature_scale > 1e-6, feature_scale, 1.0)
    hidden_size = design.embeddings.shape[1] // max(len(encoder_info.get("layers", [1])), 1)
    embedding_scale = config.embedding_weight * math.sqrt(hidden_size)
    embedded = (design.embeddings * embedding_scale).astype(np.float64)
    basis = _row_basis(embedded)
    x = np.hstack([embedded @ basis if basis is not None else embedded,
                   (design.features - feature_mean) / feature_scale]).astype(np.float64)

    # Grouped cross-validation: choose the penalty, collect out-of-fold log residuals.
    num_groups = len(np.unique(groups))
    num_folds = min(config.num_folds, num_groups)
    alphas = replace(config, method="ridge").penalties
    num_models = len(model_names)
    if num_folds >= 2:
        folds = _fold_of_groups(groups, num_folds, config.seed)
        # NOTE: the penalty is chosen on the squared loss (one eigendecomposition per fold for
        # every penalty); the absolute loss then refits the chosen one only (a few weighted
        # solves per fold), which keeps a retrain on thousands of distinct prompts affordable.
        oof = _out_of_fold(x, y, slots, num_models, folds, alphas, replace(config, loss="squared"))
        # The squared loss fits the mean of log tokens; shifting by the median residual turns
        # the point into a median, which is what minimises the error in tokens (MAE).
        maes = [np.abs(_clip_tokens(oof[a] + np.median(y - oof[a]), np.int64(config.max_tokens))
                       - y_tokens).mean() for a in range(len(alphas))]
        best = int(np.argmin(maes))
        log_pred = oof[best] if config.loss == "squared" else _out_of_fold(
            x, y, slots, num_models, folds, [alphas[best]], config)[0]
    else:  # one prompt: nothing to validate on, fall back to in-sample residuals
        best = len(alphas) // 2

    alpha = alphas[best]
    [(weights, intercepts)] = _fit_path(x, y, slots, num_models, [alpha], config)
    if num_folds < 2:
        log_pred = x @ weights + intercepts[slots]
    if basis is not None:  # back to one weight per embedding dimension
        num_basis = basis.shape[1]
        weights = np.concatenate([basis @ weights[:num_basis], weights[num_basis:]])
    log_offset = float(np.median(y - log_pred))
    log_pred = log_pred + log_offset
    residuals = y - log_pred
    pooled_q = float(np.quantile(residuals, config.quantile))
    model_q = np.array([
        float(np.quantile(residuals[slots == m], config.quantile))
        if counts[m] >= config.min_rows_per_model_quantile else pooled_q
        for m in range(len(model_names))])

    upper = log_pred + np.maximum(model_q[slots], 0.0)
    cap = np.int64(config.max_tokens)
    metrics = length_metrics(_clip_tokens(log_pred, cap), y_tokens,
                             p90=_clip_tokens(upper, cap))
    metrics.update({"alpha": alpha, "num_rows": int(len(y)), "num_prompts": int(num_groups),
                    "num_folds": int(num_folds), "validated": bool(num_folds >= 2)})
    trained_at = datetime.now(UTC).replace(microsecond=0).isoformat()
    digest = hashlib.sha1(weights.astype(np.float32).tobytes())
    digest.update(json.dumps([model_names, trained_at]).encode())
    head = LengthHead(
        weights=weights.astype(np.float32),
        feature_mean=feature_mean.astype(np.float32),
        feature_scale=feature_scale.astype(np.float32),
        embedding_scale=embedding_scale,
        model_names=model_names,
        model_intercepts=intercepts,
        pooled_intercept=_pooled(intercepts, counts),
        model_log_q=model_q,
        pooled_log_q=pooled_q,
        log_offset=log_offset,
        quantile=config.quantile,
        feature_names=FEATURE_NAMES,
        encoder=dict(encoder_info),
        metrics={k: _plain(v) for k, v in metrics.items()},
        version=digest.hexdigest()[:12],
        trained_at=trained_at,
    )
    return head, metrics


def _pooled(intercepts: np.ndarray, counts: np.ndarray) -> float:
    """The intercept of an unknown serving model: the row-weighted mean of the known ones."""
    return float(np.average(intercepts, weights=counts)) if counts.sum() > 0 else 0.0


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def _row_fields(row) -> tuple[str, str, int, str]:
    if isinstance(row, Mapping):
        prompt, model, tokens = row["prompt"], row["model"], row["output_tokens"]
        group = row.get("prompt_id")
    else:
        prompt, model, tokens = row.prompt, row.model, row.output_tokens
        group = getattr(row, "prompt_id", None)
    return prompt, str(model), int(tokens), str(group or full_text(prompt))


def train(rows: Iterable, *, encoder: AnyEncoder | None = None,
          counter: TokenCounter | None = None, config: TrainConfig = TrainConfig(),
          sources: Sequence[Mapping[str, object]] = ()) -> tuple[LengthPredictor, dict]:
    """Train a predictor from rows of (prompt, model, output_tokens[, prompt_id]).

    Rows are `dataset.LengthRow` objects or mappings with those keys (e.g. exported from the
    PostgreSQL request history; prompts may be chat message lists). Rows without a prompt_id are
    grouped by prompt text; rows with no output token are skipped. `encoder` defaults to this
    CPU's `default_encoder`; `sources` ({"name", "licence", "rows"}) are recorded in the artifact.
    Returns the predictor and its out-of-fold metrics (MAE in tokens, median relative error,
    share within 25%, Spearman, p90 coverage, chosen penalty, row and prompt counts).

    This is what the shipped artifact, `blockq models length-train` and the online loop's
    refit all call.
    """
    fields = [_row_fields(row) for row in rows]
    fields = [f for f in fields if f[2] >= 1]
    if not fields:
        raise ValueError("no training row with output_tokens >= 1")
    encoder = encoder or default_encoder()
    counter = counter or TokenCounter()
    if config.method == "ridge":
        design = design_matrix([f[0] for f in fields], [f[1] for f in fields],
                               encoder=encoder, counter=counter)
        head, metrics = fit_head(design, [f[2] for f in fields], [f[3] for f in fields],
                                 encoder_info=encoder_info(encoder), config=config)
    else:
        head, metrics = fit_effects_head(fields, encoder=encoder, counter=counter,
                                         config=config)
    head = replace(head, sources=tuple(dict(s) for s in sources))
    return LengthPredictor(head, encoder=encoder, counter=counter), metrics


def fit_effects_head(fields: Sequence[tuple[Prompt, str, int, str]], *, encoder: AnyEncoder,
                     counter: TokenCounter, config: TrainConfig = TrainConfig()
                     ) -> tuple[LengthHead, dict]:
    """The effects fit (`workers.predict.effects`) as a `LengthHead`: each distinct prompt is
    embedded and featurised once; rows are (prompt, model, output tokens, prompt group)."""
    group_of: dict[str, int] = {}
    first: list[int] = []
    prompt_index = np.empty(len(fields), dtype=np.int64)
    for i, (_, _, _, group) in enumerate(fields):
        if group not in group_of:
            group_of[group] = len(first)
            first.append(i)
        prompt_index[i] = group_of[group]
    prompts = [fields[i][0] for i in first]
    embeddings = encoder.embed([embedding_text(p) for p in prompts])
    features = np.stack([extract(p, num_prompt_tokens=counter(full_text(p))) for p in prompts])
    feature_mean = features.mean(0)
    feature_scale = features.std(0)
    feature_scale = np.where(feature_scale > 1e-6, feature_scale, 1.0)
    info = encoder_info(encoder)
    num_blocks = max(len(info.get("layers") or [0]), 1)
    embedding_scale = config.embedding_weight * math.sqrt(embeddings.shape[1] / num_blocks)
    x = np.hstack([embeddings * embedding_scale, (features - feature_mean) / feature_scale])
    model_names = tuple(sorted({f[1] for f in fields}))
    slot = {name: i for i, name in enumerate(model_names)}
    models = np.array([slot[f[1]] for f in fields], dtype=np.int64)
    tokens = np.array([f[2] for f in fields], dtype=np.float64)
    effects = replace(config.effects, alphas=config.penalties, num_folds=config.num_folds,
                      seed=config.seed)
    # NOTE: one BLAS thread: the fit is many small matrix products and SVDs, for which
    # OpenBLAS's threads cost more than they give: on a busy 2-core machine, a hundred times
    # the CPU of one thread (docs/measurements.md).
    with threadpool_limits(limits=1, user_api="blas"):
        fit = fit_effects(x, prompt_index, models, tokens, len(model_names), effects,
                          max_tokens=config.max_tokens, neighbour_inputs=embeddings)
    y = np.log(tokens)
    residuals = y - fit.oof_log
    counts = np.bincount(models, minlength=len(model_names))
    pooled_q = float(np.quantile(residuals, config.quantile))
    model_q = np.array([
        float(np.quantile(residuals[models == m], config.quantile))
        if counts[m] >= config.min_rows_per_model_quantile else pooled_q
        for m in range(len(model_names))])
    # An unknown model also misses its own effect: its quantile adds the spread of the effects.
    unknown_q = float(np.quantile(residuals + fit.model_effects[models] - fit.prior_effect,
                                  config.quantile))
    cap = np.int64(config.max_tokens)
    metrics = length_metrics(_clip_tokens(fit.oof_log, cap), tokens,
                             p90=_clip_tokens(fit.oof_log + np.maximum(model_q[models], 0), cap))
    metrics.update({"alpha": fit.alpha, "num_rows": int(len(tokens)),
                    "num_prompts": len(first), "num_models": len(model_names),
                    "num_folds": fit.num_folds, "validated": fit.num_folds >= 2,
                    "method": "effects", "interaction_rank": fit.rank,
                    "interaction_alpha": fit.interaction_alpha, "prior_rows": fit.prior_rows,
                    "neighbour_share": fit.neighbour_share,
                    # NOTE: one text (comma-separated), so the metrics stay a flat mapping.
                    "prompt_insensitive_models": ", ".join(model_names[i]
                                                           for i in fit.insensitive)})
    trained_at = datetime.now(UTC).replace(microsecond=0).isoformat()
    digest = hashlib.sha1(fit.prompt_weights.astype(np.float32).tobytes())
    digest.update(fit.model_effects.astype(np.float32).tobytes())
    digest.update(json.dumps([model_names, trained_at]).encode())
    rank = fit.rank
    head = LengthHead(
        weights=fit.prompt_weights.astype(np.float32),
        feature_mean=feature_mean.astype(np.float32),
        feature_scale=feature_scale.astype(np.float32),
        embedding_scale=embedding_scale,
        model_names=model_names,
        model_intercepts=fit.model_effects,
        pooled_intercept=fit.prior_effect,
        model_log_q=model_q,
        pooled_log_q=unknown_q,
        log_offset=0.0,
        quantile=config.quantile,
        feature_names=FEATURE_NAMES,
        encoder=info,
        metrics={k: _plain(v) for k, v in metrics.items()},
        version=digest.hexdigest()[:12],
        trained_at=trained_at,
        model_scales=fit.sensitivities,
        pooled_scale=fit.prior_scale,
        prompt_bias=fit.prompt_bias,
        factor_weights=fit.factor_weights if rank else None,
        model_factors=fit.model_factors if rank else None,
        prior_rows=fit.prior_rows,
        # NOTE: rounded to float16 as the artifact stores them, so that a loaded head predicts
        # what this one does; held as float32 (numpy's float16 arithmetic is slow).
        neighbour_embeddings=(embeddings[fit.neighbour_prompts].astype(np.float16)
                              .astype(np.float32) if fit.neighbour_share else None),
        neighbour_effects=fit.neighbour_effects if fit.neighbour_share else None,
        neighbours=effects.neighbours if fit.neighbour_share else 0,
        neighbour_temperature=effects.neighbour_temperature,
    )
    return head, metrics


def encoder_info(encoder: AnyEncoder) -> dict:
    """What an artifact records about the encoder its head was trained on."""
    if getattr(encoder, "kind", "transformer") == "static":
        return {"name": encoder.name, "dim": encoder.dim, "max_seq_len": encoder.max_seq_len,
                "layers": None, "tail_share": encoder.config.tail_share, "num_layers": None,
                "kind": "static"}
    return {"name": encoder.name, "dim": encoder.dim, "max_seq_len": encoder.max_seq_len,
            "layers": list(encoder.config.layers), "tail_share": encoder.config.tail_share,
            "num_layers": encoder.config.num_layers}


def cpu_has_amx_bf16() -> bool:
    """True when this CPU has AMX tiles for bfloat16 (Intel Sapphire Rapids and later), read
    from the kernel's CPU flags without importing torch; False where they cannot be read."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "amx_bf16" in flags


def default_encoder_kind() -> str:
    """"minilm" where the CPU runs it one prompt at a time within the hot path's budget, else
    "static": what `--encoder auto` trains on. Serving picks its head by path instead
    (`head_artifact`): the hot path the static head, bulk work MiniLM, on every CPU.

    NOTE: MiniLM is the accurate encoder (a lower MAE on unseen prompts, with the neighbours).
    Its CPU cost per prompt, batched, depends on the matrix units: within the hot path's budget
    with AMX, over it without AMX and further over it without native bfloat16. Without AMX the
    static encoder (no torch, a fraction of the cost) answers instead (figures:
    docs/measurements.md, docs/benchmarks_length.md).
    """
    return "minilm" if cpu_has_amx_bf16() else "static"


def _encoder_kind(kind: str) -> str:
    """"minilm" or "static": `kind` itself, or this CPU's for "auto"."""
    if kind not in ENCODER_KINDS:
        raise ValueError(f"encoder must be one of {', '.join(ENCODER_KINDS)}, got {kind!r}")
    return default_encoder_kind() if kind == "auto" else kind


def bootstrap_artifact(kind: str = "auto") -> Path:
    """The shipped head for an encoder kind ("auto": this CPU's `default_encoder_kind`)."""
    return BOOTSTRAP_ARTIFACT if _encoder_kind(kind) == "minilm" else STATIC_BOOTSTRAP_ARTIFACT


#: The heads by path: "fast" on the hot path (one prompt at a time, within its budget),
#: "accurate" for bulk work (batch lines, the bulk predictor, planning, learning), batched.
HEAD_PATHS = ("fast", "accurate")


def static_sibling(artifact: Path | str) -> Path:
    """Where `blockq models length-train` writes the fast (static) head beside an accurate
    one: `<stem>_static.npz`, as the shipped pair is named."""
    artifact = Path(artifact)
    return artifact.with_name(f"{artifact.stem}_static{artifact.suffix}")


def head_artifact(path: str, *, accurate: Path | None = None, fast: Path | None = None) -> Path:
    """The artifact a path's head loads (`accurate`, `fast`: the configured ones, or None).

    fast: `fast`, else the static sibling of `accurate` where it exists, else the shipped
    static head. accurate: `accurate`, else the shipped MiniLM head, whatever this CPU: batched,
    MiniLM costs a few milliseconds a prompt even without AMX, off any request's path.
    """
    if path not in HEAD_PATHS:
        raise ValueError(f"head path must be one of {', '.join(HEAD_PATHS)}, got {path!r}")
    if path == "accurate":
        return accurate or BOOTSTRAP_ARTIFACT
    if fast is not None:
        return fast
    if accurate is not None and static_sibling(accurate).is_file():
        return static_sibling(accurate)
    return STATIC_BOOTSTRAP_ARTIFACT


def make_encoder(kind: str = "auto") -> AnyEncoder:
    """An encoder by kind: "minilm" (the packaged transformer), "static" (the shipped distilled
    matrix, no torch) or "auto" (`default_encoder_kind`)."""
    return minilm_encoder() if _encoder_kind(kind) == "minilm" else StaticEncoder.load()


def default_encoder() -> AnyEncoder:
    """The encoder new heads are trained on when none is given: this CPU's default kind."""
    return make_encoder("auto")


def minilm_encoder() -> Encoder:
    """The packaged MiniLM, its six layers pooled over 64 tokens, on one torch thread."""
    return Encoder(EncoderConfig(num_threads=1))


def build_encoder(info: Mapping, path: str | None = None, **runtime) -> AnyEncoder:
    """The encoder a head was trained on (`LengthHead.encoder`), loaded.

    A static encoder loads from `path` (default: the shipped matrix); a transformer from `path`
    (default: the packaged MiniLM) with runtime-only knobs (dtype, threads, batch size).
    """
    if info.get("kind") == "static":
        if path is None and info["name"] != STATIC_ENCODER:
            raise ValueError(f"the head was trained on static encoder {info['name']!r}; "
                             "pass the path of its matrix")
        return StaticEncoder.load(path or STATIC_ARTIFACT, config=StaticEncoderConfig(
            max_seq_len=int(info["max_seq_len"]), tail_share=float(info["tail_share"])))
    if info["name"] != DEFAULT_ENCODER and path is None:
        raise ValueError(f"the head was trained on encoder {info['name']!r}; "
                         "pass encoder_path= the local directory of that encoder")
    num_layers = info.get("num_layers")
    return _shared_encoder(EncoderConfig(
        path=path, max_seq_len=int(info["max_seq_len"]), tail_share=float(info["tail_share"]),
        layers=tuple(int(i) for i in info["layers"]),
        num_layers=None if num_layers is None else int(num_layers), **runtime))


@functools.cache
def _shared_encoder(config: EncoderConfig) -> Encoder:
    """One transformer encoder per configuration and process: loading and tracing one costs
    a large share of a second of CPU (docs/measurements.md), and every predictor of the process
    (each app an API process or a test makes, each hot-reloaded head) embeds alike with it."""
    return Encoder(config)


def evaluate(predictor: LengthPredictor, rows: Iterable, *, max_tokens: int = 4096) -> dict:
    """Metrics of `predictor` on held-out rows (same row shapes as `train`)."""
    fields = [_row_fields(row) for row in rows]
    predictions = predictor.predict_batch([f[0] for f in fields], [f[1] for f in fields],
                                          max_tokens)
    return length_metrics(np.array([p.tokens for p in predictions]),
                          np.array([f[2] for f in fields]),
                          p90=np.array([p.p90_tokens for p in predictions]))


# -- metrics ------------------------------------------------------------------------------------

def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (as scipy.stats.rankdata)."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values))
    sorted_values = values[order]
    start = 0
    for end in range(1, len(values) + 1):
        if end == len(values) or sorted_values[end] != sorted_values[start]:
            ranks[order[start:end]] = (start + end - 1) / 2.0
            start = end
    return ranks


def length_metrics(predicted: np.ndarray, actual: np.ndarray,
                   p90: np.ndarray | None = None) -> dict[str, float]:
    """MAE in tokens, median relative error, share within +-25%, Spearman, p90 coverage."""
    predicted = np.asarray(predicted, dtype=np.float64)
    actual = np.asarray(actual, dtype=np.float64)
    if predicted.shape != actual.shape or not len(actual):
        raise ValueError("need as many predictions as actual lengths, at least one")
    errors = np.abs(predicted - actual)
    relative = errors / np.maximum(actual, 1.0)
    rp, ra = _ranks(predicted), _ranks(actual)
    denominator = rp.std() * ra.std()
    metrics = {
        "mae_tokens": float(errors.mean()),
        "median_rel_error": float(np.median(relative)),
        "within_25pct": float((relative <= 0.25).mean()),
        "spearman": float(((rp - rp.mean()) * (ra - ra.mean())).mean() / denominator)
        if denominator > 0 else 0.0,
    }
    if p90 is not None:
        metrics["p90_coverage"] = float((actual <= np.asarray(p90)).mean())
    return metrics
