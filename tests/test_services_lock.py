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


def make_name(url: str) -> str:
    return url.rsplit("/", 1)[1]


def test_a_second_holder_is_refused_naming_the_url_and_the_variable() -> None:
    url = _own_url()
    first = services_lock.hold({"BLOCKQ_TEST_DATABASE_URL": url})
    try:
        with pytest.raises(services_lock.ServicesBusy) as busy:
            services_lock.hold({"BLOCKQ_TEST_DATABASE_URL": url})
        message = str(busy.value)
        assert f"pid {os.getpid()}" in message
        assert make_name(url) in message and "BLOCKQ_TEST_DATABASE_URL" in message
        assert "s3cret" not in message
    finally:
        for handle in first:
            handle.close()
    again = services_lock.hold({"BLOCKQ_TEST_DATABASE_URL": url})  # released on close
    for handle in again:
        handle.close()


def test_a_refused_run_releases_what_it_had_taken() -> None:
    free, taken = _own_url(), f"redis://:s3cret@127.0.0.1:6379/0?run={uuid.uuid4().hex}"
    holder = services_lock.hold({"B": taken})
    try:
        with pytest.raises(services_lock.ServicesBusy) as busy:
            services_lock.hold({"A": free, "B": taken})
        assert "127.0.0.1:6379" in str(busy.value) and "s3cret" not in str(busy.value)
        for handle in services_lock.hold({"A": free}):  # A was let go
            handle.close()
    finally:
        for handle in holder:
            handle.close()


def test_a_dead_runs_lock_is_free() -> None:
    """The kernel releases a killed holder's lock: no stale lock file blocks the next run."""
    url = _own_url()
    code = ("import os, sys; from tests import services_lock; "
            f"services_lock.hold({{'V': {url!r}}}); print('held', flush=True); os._exit(0)")
    held = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    assert held.stdout.strip() == "held"
    for handle in services_lock.hold({"V": url}):
        handle.close()
