"""Names of queues and tasks, and the sends the API and workers make by task name.

The API never imports worker code: it reaches the workers only through the Celery app object,
naming tasks here. A message that must follow a commit is staged in that transaction through the
outbox (domain/outbox.py), which sends it once the transaction committed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    "TASK_RELEASE_HELD",
    "TASK_GENERATE",
    "TASK_WEBHOOK",
    "TASK_REQUEUE_ORPHANS",
    "TASK_RETRAIN_LENGTH",
    "TASK_REFIT_EXEC",
    "TASK_RELAY_OUTBOX",
    "TASK_PURGE",
    "Message",
    "predict",
    "route",
    "release_held",
    "generate",
    "webhook",
    "retrain",
    "QUEUE_BATCHES",
    "TASK_BATCH_EXPAND",
    "TASK_BATCH_RELEASE",
    "TASK_BATCH_EXPIRE",
    "TASK_BATCH_FINALIZE",
    "TASK_BATCH_ESTIMATE",
    "TASK_BATCH_ESTIMATES",
    "batch_task",
]

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
TASK_RELEASE_HELD = "route.release_held"
TASK_GENERATE = "serve.generate"
TASK_WEBHOOK = "webhooks.deliver"
TASK_REQUEUE_ORPHANS = "health.requeue_orphans"
TASK_RELAY_OUTBOX = "health.relay_outbox"
TASK_PURGE = "health.purge"
TASK_RETRAIN_LENGTH = "learn.retrain_length"
TASK_REFIT_EXEC = "learn.refit_exec"
TASK_BATCH_EXPAND = "batches.expand"
TASK_BATCH_RELEASE = "batches.release"
TASK_BATCH_EXPIRE = "batches.expire"
TASK_BATCH_FINALIZE = "batches.finalize"
#: A batch's completion estimate (one batch; beat: every running one), on the bulk predictor,
#: whose accurate length head is loaded already (workers/batch/estimates.py).
TASK_BATCH_ESTIMATE = "predict.batch_eta"
TASK_BATCH_ESTIMATES = "predict.batch_etas"


@dataclass(frozen=True, slots=True)
class Message:
    """One task to send: by name, to a queue. Built here, sent at once (`send`) or, when it
    must follow a commit, staged in the same transaction through the outbox (domain/outbox.py)."""

    task: str
    queue: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    priority: int = 0

    def send(self, celery: Celery, *, countdown: float = 0, retry: bool = True) -> None:
        """`retry`: Celery's publish retries while the broker is unreachable (about a second)."""
        celery.send_task(self.task, args=list(self.args), kwargs=self.kwargs, queue=self.queue,
                         priority=self.priority, countdown=countdown or None, retry=retry)


def predict(request_id: str, *, priority: int) -> Message:
    """Interactive requests to `predict`, batch lines (priority above 0) to `predict_bulk`."""
    queue = QUEUE_PREDICT if priority == 0 else QUEUE_PREDICT_BULK
    return Message(TASK_PREDICT, queue, (request_id,), priority=priority)


def route(request_id: str, *, priority: int, timing: dict[str, float] | None = None) -> Message:
    """`timing`: Unix times the predict stage took and finished the request, for the route
    task's overhead record."""
    return Message(TASK_ROUTE, QUEUE_ROUTE, (request_id,), {"timing": timing or {}},
                   priority=priority)


def release_held() -> Message:
    """Route what the router holds that an instance would now start (late binding)."""
    return Message(TASK_RELEASE_HELD, QUEUE_ROUTE)


def generate(request_id: str, *, instance_id: str, attempt: int, priority: int) -> Message:
    """To the instance's own queue: the instance id is the queue name (gpu.<k>)."""
    return Message(TASK_GENERATE, instance_id, (request_id, attempt), priority=priority)


def webhook(subject_id: str, event_type: str) -> Message:
    """`subject_id`: the request (`request.*` events) or the batch (`batch.*` events)."""
    return Message(TASK_WEBHOOK, QUEUE_WEBHOOKS, (subject_id, event_type))


def batch_task(task_name: str, batch_id: str) -> Message:
    """One of the batch tasks (expand, finalize) for one batch."""
    return Message(task_name, QUEUE_BATCHES, (batch_id,))


def batch_estimate(batch_id: str) -> Message:
    """Estimate one batch's completion time (as it is validated)."""
    return Message(TASK_BATCH_ESTIMATE, QUEUE_PREDICT_BULK, (batch_id,))


def retrain(*, reason: str) -> Message:
    return Message(TASK_RETRAIN_LENGTH, QUEUE_LEARN, kwargs={"reason": reason})
