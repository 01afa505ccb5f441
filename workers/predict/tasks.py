"""Celery task of the predict stage (logic in `workers/predict/stage.py`)."""

from __future__ import annotations

import time

from celery import shared_task

from app import dispatch
from workers import runtime
from workers.predict import stage


@shared_task(name=dispatch.TASK_PREDICT)
def annotate(request_id: str) -> None:
    """Predict the output length, then hand the request to the router. Safe to run twice."""
    started_at = time.time()
    rt = runtime.get()
    query = stage.start(rt.db, request_id)
    if query is None:
        return
    answer = stage.length_predictor(rt).predict(query)
    if not stage.record(rt.db, request_id, answer):
        return  # cancelled while predicting
    dispatch.enqueue_route(
        runtime.current_celery(), request_id, priority=query.priority,
        timing={"predict_started_at": started_at, "predicted_at": time.time()},
    )
