"""One turn of the online loop: train a candidate from history, evaluate it beside the active
version on the same held-out slice of recent history, register it, promote it if it is better.

Runs from the Celery beat tasks and from `blockq models retrain|refit`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from app import model_registry as registry
from app.db import Database
from workers.learn import history
from workers.sim import ExecModel, evaluate_on_step_samples, fit_from_step_samples

if TYPE_CHECKING:
    from workers.predict.length_model import LengthPredictor

__all__ = ["LoopConfig", "LoopReport", "retrain_length_model", "refit_exec_model",
           "split_recent"]


@dataclass(frozen=True, slots=True)
class LoopConfig:
    min_rows: int = 50              # history rows needed before a turn trains anything
    max_rows: int = 20_000          # newest rows considered
    holdout_share: float = 0.2      # newest share held out for the comparison
    bootstrap_rows: Path | None = None  # JSONL of (prompt, model, output_tokens) added to training


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def split_recent(rows: Sequence[Any], holdout_share: float) -> tuple[list[Any], list[Any]]:
    """(older rows to train on, newest rows to evaluate on); rows are oldest first."""
    num_holdout = max(1, int(round(len(rows) * holdout_share)))
    return list(rows[:-num_holdout]), list(rows[-num_holdout:])


def _length_metrics_on(predictor: LengthPredictor, rows: Sequence[dict[str, Any]]
                       ) -> dict[str, float]:
    from workers.predict.length_model import length_metrics  # noqa: PLC0415 - torch, lazily

    predictions = predictor.predict_batch([r["prompt"] for r in rows], [r["model"] for r in rows],
                                          [r["max_tokens"] for r in rows])
    return length_metrics(np.array([p.tokens for p in predictions]),
                          np.array([r["output_tokens"] for r in rows]),
                          p90=np.array([p.p90_tokens for p in predictions]))


def retrain_length_model(db: Database, active: LengthPredictor, *, model_name: str,
                         config: LoopConfig) -> LoopReport:
    """Retrain the length model of `model_name` from its history (plus bootstrap rows).

    `active` is the predictor in use: the candidate shares its encoder and must beat it (MAE in
    tokens) on the newest `holdout_share` of the history to be promoted.
    """
    # NOTE: torch and the encoder load here, in the worker that retrains, not at task import
    # (every Celery process imports the task modules).
    from workers.predict.dataset import read_rows  # noqa: PLC0415
    from workers.predict.length_model import train  # noqa: PLC0415

    with db.session() as session:
        rows = history.length_rows(session, model_name, limit=config.max_rows)
    if len(rows) < config.min_rows:
        return LoopReport("length", model_name, "skipped",
                          f"{len(rows)} history rows, fewer than {config.min_rows}")
    older, holdout = split_recent(rows, config.holdout_share)
    bootstrap = read_rows(config.bootstrap_rows) if config.bootstrap_rows else []
    candidate, fit = train([*older, *bootstrap], encoder=active.encoder, counter=active.counter)
    return _register_and_judge(
        db, _Judged("length", model_name, "mae_tokens", "MAE", "tokens",
                   _length_metrics_on(candidate, holdout), _length_metrics_on(active, holdout)),
        artifact=candidate.head.to_bytes(), training_rows=len(older) + len(bootstrap),
        holdout_rows=len(holdout),
        extra_metrics={"active_predictor": active.name,
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

    @property
    def better(self) -> bool:
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
    return LoopReport(judged.kind, judged.scope, "promoted" if judged.better else "kept",
                      _verdict(judged.label, judged.candidate[judged.metric],
                               judged.active[judged.metric], judged.unit),
                      version, training_rows, holdout_rows, judged.candidate, judged.active)


def _verdict(metric: str, candidate: float, active: float, unit: str) -> str:
    relation = "beats" if candidate < active else "does not beat"
    return f"candidate {metric} {candidate:.4g}{unit and ' ' + unit} {relation} active {active:.4g}"
