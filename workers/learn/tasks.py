"""Celery tasks of the online loop (queue `learn`, scheduled by beat, also sent by the bias
watch). Each is also runnable by hand: `blockq models retrain|refit`."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from sqlalchemy import select

from domain import dispatch
from domain.models import Instance
from domain.settings import Settings
from workers import runtime
from workers.learn.loop import LoopConfig, LoopReport, refit_exec_model, retrain_length_model
from workers.locks import held
from workers.predict.stage import learned_lengths
from workers.route.stage import exec_models

__all__ = ["retrain_length", "refit_exec", "loop_config", "run_retrain", "run_refit"]

logger = logging.getLogger(__name__)

#: Longest a retrain may hold the lock that keeps retrains of one model from overlapping.
_RETRAIN_LOCK_S = 1800


def loop_config(settings: Settings) -> LoopConfig:
    return LoopConfig(min_rows=settings.learn_min_rows, max_rows=settings.learn_max_rows,
                      holdout_share=settings.learn_holdout_share,
                      bootstrap_rows=settings.length_bootstrap_rows)


def run_retrain(rt: runtime.Runtime) -> LoopReport:
    """Retrain, evaluate, register and maybe promote the served model's length model."""
    model_name = rt.settings.model_name
    if rt.settings.length_predictor != "learned":
        return LoopReport("length", model_name, "skipped", "length_predictor is not 'learned'")
    with held(rt.redis, f"blockq:learn:retrain:{model_name}", ttl_s=_RETRAIN_LOCK_S) as mine:
        if not mine:
            return LoopReport("length", model_name, "skipped", "a retrain is already running")
        report = retrain_length_model(rt.db, learned_lengths(rt).active.get(),
                                      model_name=model_name, config=loop_config(rt.settings))
    if report.outcome == "promoted":
        rt.bias_watch.reset(model_name)  # the correction belonged to the previous version
    return report


def run_refit(rt: runtime.Runtime, instance_ids: list[str] | None = None) -> list[LoopReport]:
    """Refit the execution-time model of each given (default: every registered) instance."""
    if instance_ids is None:
        with rt.db.session() as session:
            instance_ids = list(session.scalars(select(Instance.id).order_by(Instance.id)))
    models = exec_models(rt).of(instance_ids)
    return [refit_exec_model(rt.db, models[i], instance_id=i, config=loop_config(rt.settings))
            for i in instance_ids]


@shared_task(name=dispatch.TASK_RETRAIN_LENGTH)
def retrain_length(reason: str = "schedule") -> dict[str, Any]:
    report = run_retrain(runtime.get())
    logger.info("length model retrain (%s): %s, %s", reason, report.outcome, report.reason)
    return report.to_dict()


@shared_task(name=dispatch.TASK_REFIT_EXEC)
def refit_exec(instance_ids: list[str] | None = None) -> list[dict[str, Any]]:
    reports = run_refit(runtime.get(), instance_ids)
    for report in reports:
        logger.info("exec model refit of %s: %s, %s", report.scope, report.outcome, report.reason)
    return [r.to_dict() for r in reports]
