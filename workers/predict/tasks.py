"""Celery task of the predict stage."""

from __future__ import annotations

import time

from celery import shared_task

from app import dispatch, store
from app.models import InferenceRequest, Priority, RequestStatus, utcnow
from workers import runtime
from workers.predict.baseline import RunningMeanPredictor
from workers.predict.history import LengthHistory

PREDICTOR = RunningMeanPredictor()


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
        stats = LengthHistory(rt.redis, model=rt.settings.model_name).stats()
        request.predicted_output_tokens = PREDICTOR.predict(stats, max_tokens=request.max_tokens)
        request.predictor = PREDICTOR.name
        request.predicted_at = utcnow()
        priority = Priority(request.priority).rank
    dispatch.enqueue_route(
        runtime.current_celery(), request_id, priority=priority, predict_started_at=started_at
    )
