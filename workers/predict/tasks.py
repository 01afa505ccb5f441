"""Celery task of the predict stage."""

from __future__ import annotations

import time

from celery import shared_task

from app import dispatch, store
from app.models import InferenceRequest, Priority, RequestStatus, utcnow
from workers import runtime
from workers.predict.baseline import RunningMeanPredictor
from workers.predict.history import LengthHistory

BASELINE = RunningMeanPredictor()


@shared_task(name=dispatch.TASK_PREDICT)
def annotate(request_id: str) -> None:
    """Predict the output length, then hand the request to the router. Safe to run twice."""
    started_at = time.time()
    rt = runtime.get()
    with rt.db.session() as session:
        store.transition(
            session, request_id, RequestStatus.PREDICTING, allowed_from={RequestStatus.QUEUED}
        )
        request = session.get(InferenceRequest, request_id)
        if request is None or request.status != RequestStatus.PREDICTING:
            return  # cancelled, or already past this stage
        tokens, predictor = _predict_length(rt, request)
        request.predicted_output_tokens = tokens
        request.predictor = predictor
        request.predicted_at = utcnow()
        priority = Priority(request.priority).rank
    dispatch.enqueue_route(
        runtime.current_celery(), request_id, priority=priority, predict_started_at=started_at
    )


def _predict_length(rt: runtime.Runtime, request: InferenceRequest) -> tuple[int, str]:
    """(predicted output tokens, the predictor's name) with the configured predictor."""
    if rt.settings.length_predictor == "baseline":
        stats = LengthHistory(rt.redis, model=rt.settings.model_name).stats()
        return BASELINE.predict(stats, max_tokens=request.max_tokens), BASELINE.name
    predictor = rt.length_predictor
    prompt = request.messages or request.prompt
    prediction = predictor.predict(prompt, rt.settings.model_name, request.max_tokens)
    return prediction.tokens, predictor.name
