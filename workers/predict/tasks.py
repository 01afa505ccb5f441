"""Celery task of the predict stage (logic in `workers/predict/stage.py`)."""

from __future__ import annotations

import time

from celery import shared_task

from app import dispatch
from workers import runtime
from workers.predict import stage
from workers.retries import ON_OUTAGE


@shared_task(name=dispatch.TASK_PREDICT, **ON_OUTAGE)
def annotate(request_id: str) -> None:
    """Predict the output length, then hand the request to the router. Safe to run twice."""
    started_at = time.time()
    rt = runtime.get()
    query = stage.start(rt.db, request_id)
    if query is None:
        return
    answer = stage.length_predictor(rt).predict(query)
    with rt.outbox.transaction() as tx:
        if not stage.record(tx.session, request_id, answer):
            return  # cancelled while predicting
        tx.post(dispatch.route(
            request_id, priority=query.priority,
            timing={"predict_started_at": started_at, "predicted_at": time.time()},
        ))
