"""Two test runs never share a test database or Redis db (tests/services_lock.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from tests import services_lock
from tests.environment import ROOT


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
    code = ("import sys, time; from tests import services_lock; "
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
