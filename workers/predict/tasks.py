"""Celery task of the predict stage (logic in `workers/predict/stage.py`)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from celery import shared_task

from app import dispatch
from app.models import RequestStatus
from workers import runtime
from workers.predict import stage
from workers.predict.stage import LengthAnswer
from workers.retries import ON_OUTAGE
from workers.route import stage as route_stage
from workers.route import tasks as route_tasks
from workers.route.policies import RequestView


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


def route_predicted(rt: runtime.Runtime, request_id: str, started: stage.Started,
                    answer: LengthAnswer, timing: dict[str, float], *, status: RequestStatus,
                    retire: Sequence[int] = ()) -> route_tasks.Routing:
    """Route a request just predicted, from `status`, writing its prediction with the
    decision (`route_tasks.route_request`; `retire`: deferred outbox entries that transaction
    deletes). Falsy when no instance is routable: nothing was written."""
    query = started.query
    request = route_stage.RouteInput(
        view=RequestView(request_id=request_id, num_prompt_tokens=started.num_prompt_tokens,
                         predicted_output_tokens=answer.tokens, max_tokens=query.max_tokens,
                         prompt_token_ids=route_stage.prompt_token_ids(
                             rt, started.prompt, started.prompt_token_ids),
                         priority_class=query.priority),
        priority=query.priority, status=status, instance_id=None, attempt=started.attempt,
        targets=started.targets, session_key=started.session_key, model=query.model or None)
    return route_tasks.route_request(rt, request, timing, timing["predicted_at"],
                                     allowed_from={status},
                                     columns=stage.prediction_columns(answer), retire=retire)
