"""Names of queues and tasks, and the sends the API and workers make by task name.

The API never imports worker code: it reaches the workers only through the Celery app object,
naming tasks here. Sends happen after the database transaction that they depend on committed.
"""

from __future__ import annotations

import logging

from celery import Celery

__all__ = [
    "QUEUE_PREDICT",
    "QUEUE_PREDICT_BULK",
    "QUEUE_ROUTE",
    "QUEUE_WEBHOOKS",
    "QUEUE_HEALTH",
    "QUEUE_LEARN",
    "TASK_PREDICT",
    "TASK_ROUTE",
    "TASK_GENERATE",
    "TASK_WEBHOOK",
    "TASK_REQUEUE_ORPHANS",
    "TASK_RETRAIN_LENGTH",
    "TASK_REFIT_EXEC",
    "enqueue_predict",
    "enqueue_route",
    "enqueue_generate",
    "enqueue_webhook",
    "enqueue_retrain",
    "QUEUE_BATCHES",
    "TASK_BATCH_EXPAND",
    "TASK_BATCH_RELEASE",
    "TASK_BATCH_EXPIRE",
    "TASK_BATCH_FINALIZE",
    "enqueue_batch_task",
]

logger = logging.getLogger(__name__)

QUEUE_PREDICT = "predict"
#: Length predictions of batch lines: their own predictor worker, so that bulk work never
#: holds the interactive predictor's threads.
QUEUE_PREDICT_BULK = "predict_bulk"
QUEUE_ROUTE = "route"
QUEUE_WEBHOOKS = "webhooks"
QUEUE_HEALTH = "health"
QUEUE_LEARN = "learn"
QUEUE_BATCHES = "batches"

TASK_PREDICT = "predict.annotate"
TASK_ROUTE = "route.dispatch"
TASK_GENERATE = "serve.generate"
TASK_WEBHOOK = "webhooks.deliver"
TASK_REQUEUE_ORPHANS = "health.requeue_orphans"
TASK_RETRAIN_LENGTH = "learn.retrain_length"
TASK_REFIT_EXEC = "learn.refit_exec"
TASK_BATCH_EXPAND = "batches.expand"
TASK_BATCH_RELEASE = "batches.release"
TASK_BATCH_EXPIRE = "batches.expire"
TASK_BATCH_FINALIZE = "batches.finalize"


def enqueue_predict(celery: Celery, request_id: str, *, priority: int) -> None:
    """Interactive requests to `predict`, batch lines (priority above 0) to `predict_bulk`."""
    queue = QUEUE_PREDICT if priority == 0 else QUEUE_PREDICT_BULK
    celery.send_task(TASK_PREDICT, args=[request_id], queue=queue, priority=priority)


def enqueue_route(
    celery: Celery,
    request_id: str,
    *,
    priority: int,
    countdown: float = 0,
    timing: dict[str, float] | None = None,
) -> None:
    """`timing`: Unix times the predict stage took and finished the request, for the route
    task's overhead record."""
    celery.send_task(
        TASK_ROUTE,
        args=[request_id],
        kwargs={"timing": timing or {}},
        queue=QUEUE_ROUTE,
        priority=priority,
        countdown=countdown,
    )


def enqueue_generate(
    celery: Celery, request_id: str, *, instance_id: str, attempt: int, priority: int
) -> None:
    """Send to the instance's own queue: the instance id is the queue name (gpu.<k>)."""
    celery.send_task(
        TASK_GENERATE, args=[request_id, attempt], queue=instance_id, priority=priority
    )


def enqueue_webhook(celery: Celery, subject_id: str, event_type: str) -> None:
    """`subject_id`: the request (`request.*` events) or the batch (`batch.*` events)."""
    celery.send_task(TASK_WEBHOOK, args=[subject_id, event_type], queue=QUEUE_WEBHOOKS)


def enqueue_batch_task(celery: Celery, task_name: str, batch_id: str) -> None:
    """One of the batch tasks (expand, finalize) for one batch."""
    celery.send_task(task_name, args=[batch_id], queue=QUEUE_BATCHES)


def enqueue_retrain(celery: Celery, *, reason: str) -> None:
    celery.send_task(TASK_RETRAIN_LENGTH, kwargs={"reason": reason}, queue=QUEUE_LEARN)
