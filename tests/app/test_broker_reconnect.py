"""A worker survives losing its Redis broker: Redis killed with a task in flight, restarted empty
two seconds later, and the worker (the workers' Celery configuration, its own Redis on a free
port) is still running and works on a task sent afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from domain.celery_app import create_celery
from domain.settings import Settings
from tests.environment import ROOT, free_port
from tests.redis_server import RedisServer, eventually

_CELERY = str(Path(sys.executable).parent / "celery")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(free_port(), tmp_path)
    server.start()
    yield server
    server.kill()


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    """The file the stand-in tasks append to (tests/app/reconnect_app.py)."""
    path = tmp_path / "marks"
    path.touch()
    return path


@pytest.fixture
def worker(broker: RedisServer, marks: Path, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A worker like the route worker (threads, acks late) on the stand-in tasks."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("BLOCKQ_") or key == "BLOCKQ_TEST_KOMBU_TRANSPORT"}
    env.update(BLOCKQ_REDIS_URL=broker.url, BLOCKQ_TEST_MARKS=str(marks), PYTHONPATH=str(ROOT))
    with open(tmp_path / "worker.log", "wb") as log:
        process = subprocess.Popen(
            [_CELERY, "-A", "tests.app.reconnect_app", "worker", "-Q", "route", "-n",
             "route@%h", "--pool", "threads", "--concurrency", "4", "-l", "INFO"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True,
        )
    yield process
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def test_a_worker_with_a_task_in_flight_survives_a_redis_restart_and_takes_new_work(
    broker: RedisServer, worker: subprocess.Popen[bytes], marks: Path, tmp_path: Path
) -> None:
    sender = create_celery(Settings(redis_url=broker.url))

    def marked(text: str) -> bool:
        return text in marks.read_text().splitlines()

    sender.send_task("route.test_mark", args=["before"])
    assert eventually(lambda: marked("before")), "the worker never took a task"
    sender.send_task("route.test_hold", args=["held", 5.0])
    assert eventually(lambda: marked("held"))

    broker.kill()  # the task is in flight, unacknowledged (acks late)
    time.sleep(2)
    broker.start()  # empty
    sender.send_task("route.test_mark", args=["after"])

    log = tmp_path / "worker.log"
    assert eventually(lambda: marked("after") or worker.poll() is not None), log.read_text()
    assert worker.poll() is None, log.read_text()
    assert marked("after")
    text = log.read_text()
    assert "Connection to broker lost" in text  # it did lose it, with the task in flight
    assert "Unrecoverable error" not in text
