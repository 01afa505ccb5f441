"""The one Celery application factory: configuration from Settings, queues, routes and the beat
schedule. The API uses the app it builds to send tasks by name; the workers' entrypoint
(`workers/celery.py`) adds the task modules."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from celery import Celery

from domain.dispatch import (
    QUEUE_BATCHES,
    QUEUE_HEALTH,
    QUEUE_LEARN,
    QUEUE_PREDICT,
    QUEUE_PREDICT_BULK,
    QUEUE_ROUTE,
    QUEUE_WEBHOOKS,
    TASK_BATCH_ESTIMATES,
    TASK_BATCH_EXPIRE,
    TASK_BATCH_RELEASE,
    TASK_PURGE,
    TASK_REFIT_EXEC,
    TASK_RELAY_OUTBOX,
    TASK_REQUEUE_ORPHANS,
    TASK_RETRAIN_LENGTH,
)
from domain.queues import PRIORITY_STEPS, SEPARATOR
from domain.settings import Settings

__all__ = ["PERIODIC_HEADER", "SOFT_SHUTDOWN_TIMEOUT_S", "create_celery"]

#: The message header in which beat sends a periodic task's interval (seconds); the worker's
#: gate (workers/beat.py) runs such a task at most once per half of it.
PERIODIC_HEADER = "blockq_every_s"

#: Celery's soft shutdown: after a cold shutdown request (SIGQUIT, which `Stack.stop` sends to a
#: worker whose warm shutdown outlasted its grace), how long tasks still running may go on before
#: they are cancelled and their messages requeued (rather than left for the visibility timeout).
SOFT_SHUTDOWN_TIMEOUT_S = 10.0


def create_celery(settings: Settings, *, include: Sequence[str] = (),
                  set_as_current: bool = True, task_cls: str | None = None) -> Celery:
    """Build the Celery app. Safe defaults for at-least-once work with idempotent tasks.

    `include`: the task modules a worker imports (none for a process that only sends tasks);
    `task_cls`: the tasks' base class, as Celery takes it (`"module:Class"`; the workers').
    """
    app_class = _WholeSecondCountdowns if settings.broker_is_rabbitmq else Celery
    celery = app_class("blockq", include=list(include), set_as_current=set_as_current,
                       **({"task_cls": task_cls} if task_cls else {}))
    celery.conf.update(
        broker_url=settings.resolved_broker_url,
        broker_connection_retry_on_startup=True,
        # A worker that lost Redis keeps trying to reconnect, however long the outage (Celery's
        # default gives up after 100 tries and ends the worker). Sending tasks is not affected.
        broker_connection_retry=True,
        broker_connection_max_retries=None,
        broker_transport_options=_redis_transport_options(settings),
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        # A task is acknowledged after it ran; a worker that dies mid-task leaves it queued.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_default_priority=0,
        worker_prefetch_multiplier=1,
        worker_soft_shutdown_timeout=SOFT_SHUTDOWN_TIMEOUT_S,
        task_routes={
            # NOTE: before "predict.*": the estimates run where the accurate head is loaded.
            "predict.batch_eta*": {"queue": QUEUE_PREDICT_BULK},
            "predict.*": {"queue": QUEUE_PREDICT},
            "route.*": {"queue": QUEUE_ROUTE},
            "webhooks.*": {"queue": QUEUE_WEBHOOKS},
            "health.*": {"queue": QUEUE_HEALTH},
            "learn.*": {"queue": QUEUE_LEARN},
            "batches.*": {"queue": QUEUE_BATCHES},
        },
        beat_schedule=_beat_schedule(settings),
        enable_utc=True,
    )
    if settings.broker_is_rabbitmq:
        celery.conf.update(_rabbitmq_options())
    celery.conf.blockq_settings = settings
    return celery


class _WholeSecondCountdowns(Celery):
    """Countdowns rounded up to whole seconds: RabbitMQ's native delayed delivery, which Celery
    uses for quorum queues, counts whole seconds, and Celery (5.7) fails a countdown under one
    second there ("countdown must be a positive number"). Task.retry sends through here too."""

    def send_task(self, *args: Any, countdown: float | None = None, **options: Any) -> Any:
        if countdown is not None and countdown > 0:
            countdown = math.ceil(countdown)
        return super().send_task(*args, countdown=countdown, **options)


def _redis_transport_options(settings: Settings) -> dict[str, Any]:
    return {
        "visibility_timeout": settings.broker_visibility_timeout_s,
        # Lower number first: 0 interactive, 1 batch.
        "queue_order_strategy": "priority",
        "priority_steps": list(PRIORITY_STEPS),
        "sep": SEPARATOR,
    }


def _rabbitmq_options() -> dict[str, Any]:
    """RabbitMQ with quorum queues (replicated, durable; Celery's recommended setup).

    Every queue, the engines' `gpu.<k>` too, is declared as a quorum queue with a topic
    exchange: Celery sends countdowns (route retries, webhook backoff) to quorum queues through
    RabbitMQ's native delayed delivery, which does not work with direct exchanges. Publishes
    wait for the broker's confirmation. Quorum queues of RabbitMQ before 4.0 ignore message
    priorities: batch work does not yield to interactive work in the broker (the engines'
    scheduling still orders it). Heartbeats every 10 s (below)."""
    return {
        "broker_transport_options": {"confirm_publish": True},
        # NOTE: a worker cut off from the broker comes back on a new connection; RabbitMQ drops
        # the old one (and with it the worker's exclusive remote-control queue) only once it
        # misses heartbeats. At Celery's 120 s, a worker back within that found its own
        # `<name>.celery.pidbox` locked and exited ("Unrecoverable error: RESOURCE_LOCKED").
        "broker_heartbeat": 10,
        "task_create_missing_queue_type": "quorum",
        "task_create_missing_queue_exchange_type": "topic",
        "task_default_queue_type": "quorum",
        "task_default_exchange_type": "topic",
        "worker_detect_quorum_queues": True,
    }


def _beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """Beat's periodic tasks, each sent every `interval` seconds with its interval in the
    `PERIODIC_HEADER` header (workers/beat.py runs it at most once per half interval).

    NOTE: no `expires`. Celery turns it into an absolute time by the sending host's clock (beat's)
    and the worker compares it with its own: a worker whose clock ran more than an interval
    ahead of beat's host dropped every sweep, outbox relay and batch release as expired. What
    `expires` was for, a backlog of runs queued while no worker took them not running back to
    back, is kept by the gate, which reads Redis's clock only."""
    intervals = (
        ("requeue-orphans", TASK_REQUEUE_ORPHANS, settings.orphan_check_interval_s),
        ("relay-outbox", TASK_RELAY_OUTBOX, settings.outbox_relay_interval_s),
        ("release-batch-lines", TASK_BATCH_RELEASE, settings.batch_release_interval_s),
        ("expire-batches", TASK_BATCH_EXPIRE, settings.batch_expiry_check_interval_s),
        ("estimate-batches", TASK_BATCH_ESTIMATES, settings.batch_eta_interval_s),
        ("retrain-length-model", TASK_RETRAIN_LENGTH, settings.learn_retrain_interval_s),
        ("refit-exec-models", TASK_REFIT_EXEC, settings.learn_refit_interval_s),
        ("retention-purge", TASK_PURGE, settings.purge_interval_s),
    )
    return {name: {"task": task, "schedule": interval,
                   "options": {"headers": {PERIODIC_HEADER: interval}}}
            for name, task, interval in intervals
            if interval > 0}  # 0 disables a schedule
