"""The Celery entrypoint (`celery -A workers`): the app built from Settings with every stage's
task module, signals wired."""

from app.celery_app import create_celery
from app.settings import Settings
from workers import observability as _observability  # noqa: F401 - connects signals
from workers.broker import BROKER_TRANSPORT
from workers.predict import lifecycle as _predict_lifecycle  # noqa: F401 - connects signals
from workers.serve import lifecycle as _engine_lifecycle  # noqa: F401 - connects signals

__all__ = ["celery", "TASK_MODULES"]

TASK_MODULES = (
    "workers.predict.tasks",
    "workers.route.tasks",
    "workers.serve.tasks",
    "workers.webhooks.tasks",
    "workers.health.tasks",
    "workers.learn.tasks",
    "workers.batch.tasks",
)

celery = create_celery(Settings.load(), include=TASK_MODULES)
# NOTE: a lost Redis connection must not end a worker with tasks in flight (workers/broker.py).
celery.conf.broker_transport = BROKER_TRANSPORT
