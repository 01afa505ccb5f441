"""One turn of the online loop: train a candidate from history, evaluate it beside the active
version on history it did not train on, register it, promote it if it is better.

The length model's turn (`retrain_length_model`, method "correction", the default) keeps the
active head's shared weights and fits the served model's own `ModelCorrection` on its history
(`workers.learn.correction`): cheap, and what an unseen serving model needs. The candidate is
judged on every history row past the first time block: each predicted by the same procedure
fitted on the rows before it only, paired row by row with the active model's error on the same
rows (rows an active correction was fitted on are left out), promoted only if its mean error is
lower and a paired bootstrap puts the chance that it is lower at `min_confidence` or more.
Method "refit" retrains the whole head on the history plus bootstrap rows and judges it on the
newest `holdout_share` of the history with the same paired test.

Runs from the Celery beat tasks and from `blockq models retrain|refit`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from domain import model_registry as registry
from domain.db import Database
from workers.learn import history
from workers.learn.correction import (
    CorrectionConfig,
    correction_config,
    fit_correction,
    forward_chained,
)
from workers.sim import ExecModel, evaluate_on_step_samples, fit_from_step_samples

if TYPE_CHECKING:
    from workers.predict.length_model import Design, LengthHead, LengthPredictor

__all__ = ["CorrectionTurn", "LoopConfig", "LoopReport", "PairedVerdict", "correction_turn",
           "paired_verdict", "retrain_length_model", "refit_exec_model", "split_recent"]


@dataclass(frozen=True, slots=True)
class LoopConfig:
    min_rows: int = 50              # history rows needed before a turn trains anything
    max_rows: int = 20_000          # newest rows considered
    holdout_share: float = 0.2      # newest share held out for the comparison ("refit")
    bootstrap_rows: Path | None = None  # JSONL of (prompt, model, output_tokens) added ("refit")
    #: "correction": fit the served model's own correction on the active head (default);
    #: "refit": retrain the whole head on history + bootstrap rows.
    method: str = "correction"
    #: Paired-bootstrap probability that the candidate's MAE is lower, needed to promote it.
    min_confidence: float = 0.8
    correction: CorrectionConfig = CorrectionConfig()

    def __post_init__(self) -> None:
        if self.method not in ("correction", "refit"):
            raise ValueError(f"method must be 'correction' or 'refit', got {self.method!r}")


@dataclass(frozen=True, slots=True)
class LoopReport:
    kind: str
    scope: str
    outcome: str  # "promoted" | "kept" (candidate registered, not better) | "skipped"
    reason: str
    version: int | None = None
    training_rows: int = 0
    holdout_rows: int = 0
    candidate: dict[str, float] = field(default_factory=dict)
    active: dict[str, float] = field(default_factory=dict)
    confidence: float | None = None  # paired-bootstrap P(candidate MAE < active MAE)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def split_recent(rows: Sequence[Any], holdout_share: float) -> tuple[list[Any], list[Any]]:
    """(older rows to train on, newest rows to evaluate on); rows are oldest first."""
    num_holdout = max(1, int(round(len(rows) * holdout_share)))
    return list(rows[:-num_holdout]), list(rows[-num_holdout:])


def _length_predictions(predictor: LengthPredictor, rows: Sequence[dict[str, Any]]
                        ) -> tuple[np.ndarray, np.ndarray]:
    predictions = predictor.predict_batch([r["prompt"] for r in rows], [r["model"] for r in rows],
                                          [r["max_tokens"] for r in rows])
    return (np.array([p.tokens for p in predictions], dtype=np.float64),
            np.array([p.p90_tokens for p in predictions], dtype=np.float64))


def _length_metrics(predictions: tuple[np.ndarray, np.ndarray], actual: np.ndarray
                    ) -> dict[str, float]:
    from workers.predict.length_model import length_metrics  # noqa: PLC0415 - torch, lazily

    return length_metrics(predictions[0], actual, p90=predictions[1])


@dataclass(frozen=True, slots=True)
class PairedVerdict:
    """The candidate and the active model's errors on the same rows, compared pairwise."""

    rows: int
    candidate_mae: float
    active_mae: float
    confidence: float  # share of bootstrap resamples of the rows where its MAE is lower
    promote: bool


def paired_verdict(candidate_errors: np.ndarray, active_errors: np.ndarray, *,
                   min_confidence: float, resamples: int = 2000, seed: int = 0) -> PairedVerdict:
    """Promote only if the candidate's mean error is lower and, resampling the rows (pairs kept
    together), lower in at least `min_confidence` of the resamples."""
    candidate_errors = np.asarray(candidate_errors, dtype=np.float64)
    active_errors = np.asarray(active_errors, dtype=np.float64)
    if candidate_errors.shape != active_errors.shape:
        raise ValueError("need one candidate and one active error per row")
    n = len(candidate_errors)
    if n == 0:
        return PairedVerdict(0, float("nan"), float("nan"), 0.0, False)
    diff = candidate_errors - active_errors
    draws = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    confidence = float((diff[draws].mean(axis=1) < 0).mean())
    promote = bool(diff.mean() < 0 and confidence >= min_confidence)
    return PairedVerdict(n, float(candidate_errors.mean()), float(active_errors.mean()),
                         confidence, promote)


@dataclass(frozen=True, slots=True)
class CorrectionTurn:
    candidate: LengthHead
    verdict: PairedVerdict
    judged: np.ndarray     # indices of the rows both were scored on
    judged_tokens: np.ndarray  # the candidate procedure's predictions of them (earlier rows only)
    chosen: dict[str, Any]


def correction_turn(head: LengthHead, design: Design, tokens: np.ndarray, caps: np.ndarray,
                    active_tokens: np.ndarray, *, model: str, config: LoopConfig,
                    active_seen: np.ndarray | None = None, through: str = "") -> CorrectionTurn:
    """One "correction" turn on `model`'s history rows (oldest first), without a database.

    `head` is the active head (its correction of `model`, if any, is replaced), `active_tokens`
    the active model's predictions of the rows, `active_seen` marks rows the active model was
    fitted on (not judged).
    """
    if set(design.models) != {model}:
        raise ValueError(f"every history row must be of serving model {model!r}")
    config = replace(config, correction=correction_config(head, config.correction))
    keep = slice(max(len(tokens) - config.correction.max_rows, 0), None)
    tokens = np.asarray(tokens, dtype=np.float64)
    caps = np.broadcast_to(np.asarray(caps, dtype=np.float64), tokens.shape)
    inputs = head.inputs(design).astype(np.float64)
    z = head.predict_log(design, corrected=False)[0]
    oof = forward_chained(inputs[keep], z[keep], tokens[keep], caps[keep], config.correction)
    oof = np.concatenate([np.full(len(tokens) - len(oof), np.nan), oof])
    judged = np.isfinite(oof)
    residuals = np.log(tokens[judged]) - oof[judged]
    log_q = (float(np.quantile(residuals, config.correction.quantile))
             if judged.sum() >= config.correction.min_rows_quantile else None)
    if active_seen is not None:
        judged &= ~np.asarray(active_seen, dtype=bool)
    index = np.flatnonzero(judged)
    candidate_point = np.clip(np.rint(np.exp(np.clip(oof[index], 0.0, 20.0))), 1, caps[index])
    verdict = paired_verdict(np.abs(candidate_point - tokens[index]),
                             np.abs(np.asarray(active_tokens, dtype=np.float64)[index]
                                    - tokens[index]),
                             min_confidence=config.min_confidence)
    correction, chosen = fit_correction(inputs[keep], z[keep], tokens[keep], caps[keep],
                                        config.correction, through=through, log_q=log_q)
    return CorrectionTurn(head.with_correction(model, correction), verdict, index,
                          candidate_point, chosen)


def retrain_length_model(db: Database, active: LengthPredictor, *, model_name: str,
                         config: LoopConfig) -> LoopReport:
    """Retrain the length model of `model_name` from its history (see the module docstring).

    `active` is the predictor in use: the candidate shares its encoder (and, by default, its
    head) and must beat it (MAE in tokens) on history the candidate did not train on.
    """
    with db.session() as session:
        rows = history.length_rows(session, model_name, limit=config.max_rows)
    if len(rows) < config.min_rows:
        return LoopReport("length", model_name, "skipped",
                          f"{len(rows)} history rows, fewer than {config.min_rows}")
    if config.method == "refit":
        return _refit_length_model(db, active, rows, model_name=model_name, config=config)
    # NOTE: torch and the encoder load here, in the worker that retrains, not at task import
    # (every Celery process imports the task modules).
    from workers.predict.length_model import (  # noqa: PLC0415
        LengthPredictor,
        design_matrix,
        length_metrics,
    )

    design = design_matrix([r["prompt"] for r in rows], [model_name] * len(rows),
                           encoder=active.encoder, counter=active.counter)
    tokens = np.array([r["output_tokens"] for r in rows], dtype=np.float64)
    caps = np.array([max(int(r["max_tokens"]), 1) for r in rows], dtype=np.int64)
    if isinstance(active, LengthPredictor):
        active_tokens = np.array([p.tokens for p in active.head.predict(design, caps)])
    else:  # any object with predict_batch (and a head to correct), e.g. a test stand-in
        active_tokens = np.array([p.tokens for p in active.predict_batch(
            [r["prompt"] for r in rows], [model_name] * len(rows), caps.tolist())])
    current = active.head.corrections.get(model_name)
    times = [_stamp(r["finished_at"]) for r in rows]
    seen = (np.array([t <= current.through for t in times]) if current and current.through
            else None)
    turn = correction_turn(active.head, design, tokens, caps, active_tokens, model=model_name,
                           config=config, active_seen=seen, through=times[-1])
    candidate = active.with_head(turn.candidate) if isinstance(active, LengthPredictor) else None
    judged_tokens = tokens[turn.judged]
    candidate_metrics = active_metrics = {}
    if len(turn.judged):
        active_metrics = length_metrics(active_tokens[turn.judged], judged_tokens)
        # What the verdict compared: the candidate's procedure fitted on earlier rows only.
        candidate_metrics = length_metrics(turn.judged_tokens, judged_tokens)
    return _register_and_judge(
        db, _Judged("length", model_name, "mae_tokens", "MAE", "tokens", candidate_metrics,
                    active_metrics, turn.verdict),
        artifact=turn.candidate.to_bytes(), training_rows=min(len(rows),
                                                              config.correction.max_rows),
        holdout_rows=turn.verdict.rows,
        extra_metrics={"active_predictor": active.name, "method": "correction",
                       "confidence": turn.verdict.confidence,
                       "chosen": json.loads(json.dumps(turn.chosen, default=float))},
        note=f"{candidate.name if candidate else turn.candidate.name}; correction of "
             f"{model_name} on {len(rows)} history rows ({turn.chosen})")


def _stamp(value: Any) -> str:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _refit_length_model(db: Database, active: LengthPredictor, rows: list[dict[str, Any]], *,
                        model_name: str, config: LoopConfig) -> LoopReport:
    """Method "refit": the whole head retrained on older history plus bootstrap rows."""
    from workers.predict.dataset import read_rows  # noqa: PLC0415
    from workers.predict.length_model import train  # noqa: PLC0415

    older, holdout = split_recent(rows, config.holdout_share)
    bootstrap = read_rows(config.bootstrap_rows) if config.bootstrap_rows else []
    sources = [{"name": f"request history of {model_name}",
                "licence": "the deployment's own data", "rows": len(older)}]
    if bootstrap:
        sources.append({"name": str(config.bootstrap_rows),
                        "licence": "not stated (the rows' own terms apply)",
                        "rows": len(bootstrap)})
    candidate, fit = train([*older, *bootstrap], encoder=active.encoder, counter=active.counter,
                           sources=sources)
    candidate_predictions = _length_predictions(candidate, holdout)
    active_predictions = _length_predictions(active, holdout)
    actual = np.array([r["output_tokens"] for r in holdout], dtype=np.float64)
    verdict = paired_verdict(np.abs(candidate_predictions[0] - actual),
                             np.abs(active_predictions[0] - actual),
                             min_confidence=config.min_confidence)
    return _register_and_judge(
        db, _Judged("length", model_name, "mae_tokens", "MAE", "tokens",
                    _length_metrics(candidate_predictions, actual),
                    _length_metrics(active_predictions, actual), verdict),
        artifact=candidate.head.to_bytes(), training_rows=len(older) + len(bootstrap),
        holdout_rows=len(holdout),
        extra_metrics={"active_predictor": active.name, "method": "refit",
                       "confidence": verdict.confidence,
                       "fit": json.loads(json.dumps(fit, default=float))},
        note=f"{candidate.name}; history {len(older)} rows + bootstrap {len(bootstrap)}")


def refit_exec_model(db: Database, active: ExecModel, *, instance_id: str,
                     config: LoopConfig) -> LoopReport:
    """Refit an instance's execution-time model from its recorded engine steps."""
    with db.session() as session:
        samples = history.step_samples(session, instance_id, limit=config.max_rows)
    if len(samples) < config.min_rows:
        return LoopReport("exec", instance_id, "skipped",
                          f"{len(samples)} step samples, fewer than {config.min_rows}")
    older, holdout = split_recent(samples, config.holdout_share)
    candidate = fit_from_step_samples(older, name=f"{instance_id}-steps",
                                      source=f"refit from {len(older)} steps of {instance_id}")
    return _register_and_judge(
        db, _Judged("exec", instance_id, "mape", "step-time MAPE", "",
                   evaluate_on_step_samples(candidate, holdout),
                   evaluate_on_step_samples(active, holdout)),
        artifact=json.dumps(candidate.to_dict()).encode(), training_rows=len(older),
        holdout_rows=len(holdout), extra_metrics={"active_model": active.name},
        note=candidate.source)


@dataclass(frozen=True, slots=True)
class _Judged:
    """A candidate and the active model scored on the same held-out slice (lower is better)."""

    kind: str
    scope: str
    metric: str  # key in both metric dicts
    label: str
    unit: str
    candidate: dict[str, float]
    active: dict[str, float]
    verdict: PairedVerdict | None = None  # the paired test, where there is one

    @property
    def better(self) -> bool:
        if self.verdict is not None:
            return self.verdict.promote
        return self.candidate[self.metric] < self.active[self.metric]


def _register_and_judge(db: Database, judged: _Judged, *, artifact: bytes, training_rows: int,
                        holdout_rows: int, extra_metrics: dict[str, Any], note: str
                        ) -> LoopReport:
    """Register the candidate; promote it only if it beat the active model."""
    with db.session() as session:
        row = registry.register(
            session, kind=judged.kind, scope=judged.scope, artifact=artifact,
            training_rows=training_rows,
            metrics={"holdout_rows": holdout_rows, "candidate": judged.candidate,
                     "active": judged.active, **extra_metrics},
            note=note)
        if judged.better:
            registry.promote(session, row)
        version = row.version
    confidence = judged.verdict.confidence if judged.verdict is not None else None
    if judged.verdict is not None and judged.verdict.rows == 0:
        reason = "no history row to judge the candidate on"
    else:
        reason = _verdict(judged.label, judged.candidate[judged.metric],
                          judged.active[judged.metric], judged.unit, judged.better, confidence)
    return LoopReport(judged.kind, judged.scope, "promoted" if judged.better else "kept",
                      reason, version, training_rows, holdout_rows, judged.candidate,
                      judged.active, confidence)


def _verdict(metric: str, candidate: float, active: float, unit: str, better: bool,
             confidence: float | None) -> str:
    relation = "beats" if better else "does not beat"
    sure = "" if confidence is None else f" (paired bootstrap: lower in {confidence:.0%})"
    return (f"candidate {metric} {candidate:.4g}{unit and ' ' + unit} {relation} active "
            f"{active:.4g}{sure}")
