"""The Celery entrypoint (`celery -A workers`): the app built from Settings, signals wired."""

from app.settings import Settings
from workers import observability as _observability  # noqa: F401 - connects signals
from workers.celery_app import create_celery
from workers.predict import lifecycle as _predict_lifecycle  # noqa: F401 - connects signals
from workers.serve import lifecycle as _engine_lifecycle  # noqa: F401 - connects signals

__all__ = ["celery"]

celery = create_celery(Settings.load())
