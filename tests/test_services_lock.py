"""Two test runs never share a test database or Redis db (benchmarks/services_lock.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from benchmarks import services_lock
from tests.environment import ROOT, worker_services


def _own_url() -> str:
    return f"postgresql+psycopg://postgres:s3cret@127.0.0.1:5432/lock_{uuid.uuid4().hex}"


def test_a_second_holder_is_refused_naming_the_url_and_the_variable() -> None:
    url = _own_url()
    with services_lock.hold({"BLOCKQ_TEST_DATABASE_URL": url}):
        with pytest.raises(services_lock.ServicesBusy) as busy:
            services_lock.hold({"BLOCKQ_TEST_DATABASE_URL": url})
        message = str(busy.value)
        assert f"pid {os.getpid()}" in message
        assert url.rsplit("/", 1)[1] in message and "BLOCKQ_TEST_DATABASE_URL" in message
        assert "s3cret" not in message
    with services_lock.hold({"BLOCKQ_TEST_DATABASE_URL": url}):  # released on close
        pass


def test_a_refused_run_releases_what_it_had_taken() -> None:
    free, taken = _own_url(), f"redis://:s3cret@127.0.0.1:6379/0?run={uuid.uuid4().hex}"
    with services_lock.hold({"B": taken}):
        with pytest.raises(services_lock.ServicesBusy) as busy:
            services_lock.hold({"A": free, "B": taken})
        assert "127.0.0.1:6379" in str(busy.value) and "s3cret" not in str(busy.value)
        with services_lock.hold({"A": free}):  # A was let go
            pass


def test_a_killed_runs_lock_is_free() -> None:
    """The kernel releases a killed holder's lock: no stale lock file blocks the next run."""
    url = _own_url()
    code = ("import sys, time; from benchmarks import services_lock; "
            f"held = services_lock.hold({{'V': {url!r}}}); print('held', flush=True); "
            "time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(services_lock.ServicesBusy, match=f"pid {holder.pid}"):
            services_lock.hold({"V": url})
    finally:
        holder.kill()
        holder.wait(timeout=30)
    with services_lock.hold({"V": url}):
        pass


def test_each_xdist_worker_gets_its_own_database_and_redis_db() -> None:
    database, redis_url = "postgresql+psycopg://u:pw@h:5432/blockq_test", "redis://h:6379/15"
    workers = [worker_services(i, database, redis_url) for i in range(4)]
    assert [db.rsplit("/", 1)[1] for db, _ in workers] == [
        f"blockq_test_gw{i}" for i in range(4)]
    assert all(":pw@h:5432/" in db for db, _ in workers)
    # The dbs after the run's own, wrapping past 15 and skipping 0 (every client's default).
    assert [url for _, url in workers] == [f"redis://h:6379/{db}" for db in (1, 2, 3, 4)]
    assert worker_services(2, database, "redis://h:6379/13")[1] == "redis://h:6379/1"
    assert len({url for _, url in (worker_services(i, database, redis_url)
                                   for i in range(14))} | {redis_url}) == 15
    with pytest.raises(ValueError, match="at most 14 test workers"):
        worker_services(14, database, redis_url)


@pytest.mark.slow  # a second pytest run with its plugins: about 11 s
def test_a_parallel_run_on_services_another_run_holds_stops_before_its_workers_start() -> None:
    """pytest-xdist's controller holds the run's services from its start: a second run on
    them stops at once, naming them, as a serial run does."""
    database, redis_url = _own_url(), f"redis://127.0.0.1:6379/15?run={uuid.uuid4().hex}"
    with services_lock.hold({"BLOCKQ_TEST_DATABASE_URL": database}):
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
             "tests/test_services_lock.py::test_a_killed_runs_lock_is_free"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")},
                 "BLOCKQ_TEST_DATABASE_URL": database, "BLOCKQ_TEST_REDIS_URL": redis_url})
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    output = run.stdout + run.stderr
    assert f"another test run (pid {os.getpid()})" in output and "s3cret" not in output
    assert "gw0" not in output  # no worker started
