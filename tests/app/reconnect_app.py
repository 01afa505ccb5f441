"""A Celery app configured as the workers' (domain/celery_app.py, workers/celery.py) with two
stand-in tasks, for the broker reconnection test: `celery -A tests.app.reconnect_app worker`.

The broker is BLOCKQ_REDIS_URL; each task appends its argument to the file BLOCKQ_TEST_MARKS.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from domain.celery_app import create_celery
from domain.settings import Settings
from workers.broker import BROKER_TRANSPORT

celery = create_celery(Settings.load())
# BLOCKQ_TEST_KOMBU_TRANSPORT=1: kombu's own transport, to see the failure the fix is for.
if not os.environ.get("BLOCKQ_TEST_KOMBU_TRANSPORT"):
    celery.conf.broker_transport = BROKER_TRANSPORT


def _mark(text: str) -> None:
    with Path(os.environ["BLOCKQ_TEST_MARKS"]).open("a") as marks:
        marks.write(text + "\n")


@celery.task(name="route.test_mark")
def mark(text: str) -> None:
    """Record `text` (a task that finishes at once)."""
    _mark(text)


@celery.task(name="route.test_hold")
def hold(text: str, seconds: float) -> None:
    """Record `text`, then stay busy `seconds` (a task in flight when the broker goes away)."""
    _mark(text)
    time.sleep(seconds)
    _mark(text + " done")
