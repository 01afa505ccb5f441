"""The Celery entrypoint (`celery -A workers`): the app built from Settings with every stage's
task module, signals wired."""

from domain.celery_app import create_celery
from domain.dispatch import (
    TASK_BATCH_EXPIRE,
    TASK_BATCH_RELEASE,
    TASK_PREDICT,
    TASK_RELAY_OUTBOX,
    TASK_RELEASE_HELD,
    TASK_REQUEUE_ORPHANS,
    TASK_ROUTE,
)
from domain.settings import Settings
from workers import observability as _observability  # noqa: F401 - connects signals
from workers.broker import BROKER_TRANSPORT
from workers.predict import lifecycle as _predict_lifecycle  # noqa: F401 - connects signals
from workers.route import lifecycle as _route_lifecycle  # noqa: F401 - connects signals
from workers.serve import lifecycle as _engine_lifecycle  # noqa: F401 - connects signals

__all__ = ["celery", "TASK_MODULES", "QUIET_TASKS"]

TASK_MODULES = (
    "workers.predict.tasks",
    "workers.route.tasks",
    "workers.serve.tasks",
    "workers.webhooks.tasks",
    "workers.health.tasks",
    "workers.learn.tasks",
    "workers.batch.tasks",
)

# Beat's periodic tasks run at most once per half interval (workers/beat.py), not Celery's expires.
celery = create_celery(Settings.load(), include=TASK_MODULES, task_cls="workers.beat:BeatTask")
# NOTE: predict and route, which every request passes through, send no task events. Flower turns
# events on in every worker; each event is a message of its own (received, started, succeeded: three
# per task, each costing CPU to send and as much again for Flower to read), more than the rest of
# those tasks' work (docs/measurements.md). The engine queues' task (generate) keeps its events: an
# operator opens Flower to see the GPU queues' work first. Workers still send their heartbeats, and
# every other task its events; a request's own history is its record (GET /v1/requests/<id>).
# The beat-driven periodic tasks (outbox relay, stranded-request sweep, batch releaser, batch
# expiry) send none either: together they run about 3.5 times a second on an idle stack, and
# their events alone were a large share of the idle stack's CPU (workers, Flower, Redis). What
# they do is logged when they find work.
QUIET_TASKS = (TASK_PREDICT, TASK_ROUTE, TASK_RELEASE_HELD, TASK_RELAY_OUTBOX,
               TASK_REQUEUE_ORPHANS, TASK_BATCH_RELEASE, TASK_BATCH_EXPIRE)
celery.conf.task_annotations = {task: {"send_events": False} for task in QUIET_TASKS}
# NOTE: every worker sends its tasks' events from its start (Celery's `-E`), not only once
# Flower's `enable_events` broadcast (every 5 s) reaches it: a worker that started after Flower
# and took work at once (an engine worker, as soon as the stack is ready) counted none of those
# tasks, so Flower showed the GPU queues online with 0 processed. The quiet tasks above stay quiet.
celery.conf.worker_send_task_events = True
# NOTE: a lost Redis connection must not end a worker with tasks in flight (workers/broker.py).
if not celery.conf.blockq_settings.broker_is_rabbitmq:
    celery.conf.broker_transport = BROKER_TRANSPORT
