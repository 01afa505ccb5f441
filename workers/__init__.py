"""Celery side of blockq. `celery -A workers ...` finds the app in `workers.celery`."""
