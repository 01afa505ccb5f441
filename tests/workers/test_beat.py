"""Beat's periodic tasks across hosts whose clocks differ: a run sent by beat on a host whose
clock is 30 s behind the worker's is run (no absolute `expires` to misread), and a backlog of
runs collapses by Redis's clock (workers/beat.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from unittest.mock import patch

import pytest
from celery import Celery
from celery.worker.request import Request

from domain.celery_app import PERIODIC_HEADER, create_celery
from domain.dispatch import QUEUE_HEALTH
from domain.settings import Settings
from workers.runtime import Runtime

#: How far the sending host's clock runs behind the worker's.
SKEW_S = 30.0


@pytest.fixture
def worker_app(configure_worker: Callable[..., Runtime]) -> Iterator[tuple[Celery, list[int]]]:
    """A worker's Celery app (the workers' task base) on an in-memory broker, with a task
    standing in for the health sweep; the list counts its runs."""
    rt = configure_worker(broker_url="memory://")
    celery = create_celery(rt.settings, set_as_current=False, task_cls="workers.beat:BeatTask")
    runs: list[int] = []
    # NOTE: finalized first, then the real sweep dropped: once any test has imported the task
    # modules, finalizing adds their shared tasks, and a task defined under a name already
    # registered is the registered one, not the stand-in.
    celery.finalize(auto=True)
    celery.tasks.pop("health.requeue_orphans", None)

    @celery.task(name="health.requeue_orphans", shared=False)
    def sweep() -> None:
        runs.append(1)

    yield celery, runs


def sent_by_beat(celery: Celery, entry: str, *, clock_offset_s: float) -> Request:
    """The message of beat's `entry` as beat sends it from a host whose clock is off by
    `clock_offset_s`, as the worker that takes it from the broker sees it."""
    options = celery.conf.beat_schedule[entry]
    with patch.object(celery, "now",
                      lambda: datetime.now(UTC) + timedelta(seconds=clock_offset_s)):
        celery.send_task(options["task"], **options["options"])
    with celery.connection_for_read() as connection:
        message = connection.SimpleQueue(QUEUE_HEALTH).get(timeout=2)
        message.ack()
    return Request(message, app=celery, task=celery.tasks[options["task"]])


def test_beat_sends_no_expiry_only_its_interval() -> None:
    schedule = create_celery(Settings(), set_as_current=False).conf.beat_schedule
    assert schedule
    for entry in schedule.values():
        assert "expires" not in entry["options"]
        assert entry["options"]["headers"] == {PERIODIC_HEADER: entry["schedule"]}


def test_a_sweep_sent_by_a_host_30s_behind_is_run(worker_app: tuple[Celery, list[int]]
                                                   ) -> None:
    celery, runs = worker_app
    request = sent_by_beat(celery, "requeue-orphans", clock_offset_s=-SKEW_S)
    assert not request.revoked(), "the worker took the sweep for expired"
    request.execute()
    assert runs == [1]


def test_a_backlog_of_sweeps_runs_once_per_half_interval(worker_app: tuple[Celery, list[int]]
                                                         ) -> None:
    celery, runs = worker_app
    interval_s = celery.conf.beat_schedule["requeue-orphans"]["schedule"]
    backlog = [sent_by_beat(celery, "requeue-orphans", clock_offset_s=0) for _ in range(5)]
    for request in backlog:  # queued while no health worker ran: taken back to back
        request.execute()
    assert runs == [1]
    time.sleep(interval_s / 2 + 0.1)
    sent_by_beat(celery, "requeue-orphans", clock_offset_s=+SKEW_S).execute()
    assert runs == [1, 1]


def test_the_same_task_sent_without_beat_always_runs(worker_app: tuple[Celery, list[int]]
                                                     ) -> None:
    celery, runs = worker_app
    task = celery.tasks["health.requeue_orphans"]
    for _ in range(3):
        task.apply()
    assert runs == [1, 1, 1]
