"""Celery task of the predict stage (logic in `workers/predict/stage.py`)."""

from __future__ import annotations

import time

from celery import shared_task

from domain import dispatch
from domain.models import RequestStatus
from workers import runtime
from workers.predict import stage
from workers.predict.handoff import route_predicted
from workers.retries import ON_OUTAGE


@shared_task(name=dispatch.TASK_PREDICT, **ON_OUTAGE)
def annotate(request_id: str) -> None:
    """Predict the output length, then route the request (or hand it to the router). Safe to
    run twice.

    With `route_in_predict` (the default) the decision is taken here and written with the
    prediction in one transaction, whose outbox publishes to the chosen instance: no hop through
    the route queue, no second read of the request. With no instance to route to, or the
    setting off, the prediction is recorded and the route task takes over.
    """
    started_at = time.time()
    rt = runtime.get()
    started = stage.start(rt.db, request_id)
    if started is None:
        return
    answer = stage.length_predictor(rt, stage.head_for(started.query)).predict(started.query)
    timing = {"predict_started_at": started_at, "predicted_at": time.time()}
    if rt.settings.route_in_predict and route_predicted(
            rt, request_id, started, answer, timing, status=RequestStatus.PREDICTING):
        return
    with rt.outbox.transaction() as tx:
        if not stage.record(tx.session, request_id, answer):
            return  # cancelled while predicting
        tx.post(dispatch.route(request_id, priority=started.query.priority, timing=timing))
