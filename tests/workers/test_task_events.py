"""Which tasks send Celery task events (workers/celery.py): the hot path's and the periodic
tasks' do not (they are most of the events, and Flower turns events on in every worker); the
engine queues' and the other tasks' do."""

from __future__ import annotations

import pytest
from celery import Task

from domain import dispatch


@pytest.fixture(scope="module")
def tasks() -> dict[str, Task]:
    from workers.celery import celery

    celery.loader.import_default_modules()
    return dict(celery.tasks)


@pytest.mark.parametrize("name", [
    dispatch.TASK_PREDICT, dispatch.TASK_ROUTE, dispatch.TASK_RELAY_OUTBOX,
    dispatch.TASK_REQUEUE_ORPHANS, dispatch.TASK_BATCH_RELEASE, dispatch.TASK_BATCH_EXPIRE,
])
def test_quiet_tasks_send_no_events(tasks: dict[str, Task], name: str) -> None:
    assert tasks[name].send_events is False


@pytest.mark.parametrize("name", [
    dispatch.TASK_GENERATE, dispatch.TASK_WEBHOOK, dispatch.TASK_BATCH_EXPAND,
    dispatch.TASK_BATCH_FINALIZE, dispatch.TASK_PURGE,
])
def test_other_tasks_keep_their_events(tasks: dict[str, Task], name: str) -> None:
    assert tasks[name].send_events is True


def test_workers_send_task_events_from_their_start() -> None:
    """Not only after Flower's periodic enable_events broadcast reaches them: the work a worker
    takes before it (an engine worker's first requests) would never show in Flower."""
    from workers.celery import celery

    assert celery.conf.worker_send_task_events is True
