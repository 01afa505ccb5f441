"""Celery task of the predict stage."""

from __future__ import annotations

import time
from dataclasses import dataclass

from celery import shared_task
from sqlalchemy import update

from app import dispatch, store
from app.models import InferenceRequest, Priority, RequestStatus, utcnow
from workers import runtime
from workers.predict.baseline import RunningMeanPredictor
from workers.predict.features import Prompt
from workers.predict.history import LengthHistory

BASELINE = RunningMeanPredictor()


@dataclass(frozen=True, slots=True)
class LengthQuery:
    """What the length predictor needs of one request."""

    prompt: Prompt
    max_tokens: int
    priority: int = 0  # Priority.rank: interactive (0) before batch (1) in the micro-batcher


@dataclass(frozen=True, slots=True)
class LengthAnswer:
    tokens: int
    p90_tokens: int | None
    predictor: str


@shared_task(name=dispatch.TASK_PREDICT)
def annotate(request_id: str) -> None:
    """Predict the output length, then hand the request to the router. Safe to run twice.

    No database connection is held while the model runs: concurrent task threads meet in the
    runtime's micro-batcher, so a burst is embedded in a few batched passes.
    """
    started_at = time.time()
    rt = runtime.get()
    query = _start_predicting(rt, request_id)
    if query is None:
        return
    answer, priority = predict_length(rt, query[0]), query[1]
    with rt.db.session() as session:
        recorded = session.execute(
            update(InferenceRequest)
            .where(InferenceRequest.id == request_id,
                   InferenceRequest.status == str(RequestStatus.PREDICTING))
            .values(predicted_output_tokens=answer.tokens,
                    predicted_output_tokens_p90=answer.p90_tokens, predictor=answer.predictor,
                    predicted_at=utcnow())
            .execution_options(synchronize_session=False)
        ).rowcount  # type: ignore[attr-defined]
    if recorded != 1:
        return  # cancelled while predicting
    dispatch.enqueue_route(
        runtime.current_celery(), request_id, priority=priority,
        timing={"predict_started_at": started_at, "predicted_at": time.time()},
    )


def _start_predicting(rt: runtime.Runtime, request_id: str) -> tuple[LengthQuery, int] | None:
    """Mark the request predicting; (query, priority rank), or None when it is past this stage.

    A redelivered task finds it already predicting and predicts again (nothing was routed yet).
    """
    with rt.db.session() as session:
        store.transition(
            session, request_id, RequestStatus.PREDICTING, allowed_from={RequestStatus.QUEUED}
        )
        request = session.get(InferenceRequest, request_id)
        if request is None or request.status != RequestStatus.PREDICTING:
            return None
        prompt = request.messages or request.prompt
        rank = Priority(request.priority).rank
        return LengthQuery(prompt, request.max_tokens, rank), rank


def predict_length(rt: runtime.Runtime, query: LengthQuery) -> LengthAnswer:
    """The configured predictor's answer for one request (batched with concurrent callers)."""
    if rt.settings.length_predictor == "baseline":
        stats = LengthHistory(rt.redis, model=rt.settings.model_name).stats()
        return LengthAnswer(BASELINE.predict(stats, max_tokens=query.max_tokens), None,
                            BASELINE.name)
    return rt.length_batcher(query, priority=query.priority)
