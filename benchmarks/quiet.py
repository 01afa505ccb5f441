"""A measurement runs alone (DEVELOPERS' rule for a 2-core machine): while a benchmark measures,
no test run, stack or other benchmark runs beside it.

`measurement()` takes the lock every test run on the default test services takes
(`benchmarks.services_lock`), so a test run and a benchmark never overlap, and raises the flag
file `MEASURING_FLAG`, which long-running helpers check before they start anything heavy.
`wait_for_quiet` then waits for the load average to settle and returns it: each benchmark prints
it at its start and at its end (`print_load_average`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks import services_lock

__all__ = ["MEASURING_FLAG", "alone", "format_load", "measurement", "print_load_average",
           "wait_for_quiet"]

#: Present while a benchmark measures.
MEASURING_FLAG = Path(tempfile.gettempdir()) / "blockq-measuring"
#: The services every default test run locks (tests/environment.py's defaults).
TEST_SERVICES = {
    "BLOCKQ_TEST_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:5432/blockq_test",
    "BLOCKQ_TEST_REDIS_URL": "redis://127.0.0.1:6379/15",
}


@contextlib.contextmanager
def measurement(*, wait_s: float = 1800.0,
                services: dict[str, str] | None = None) -> Iterator[None]:
    """Hold the test services' lock (waiting up to `wait_s` for a test run to end) and the
    measuring flag for the duration."""
    deadline = time.monotonic() + wait_s
    MEASURING_FLAG.write_text(str(os.getpid()))
    announced = False
    try:
        while True:
            try:
                held = services_lock.hold(services or TEST_SERVICES)
                break
            except services_lock.ServicesBusy as busy:
                if time.monotonic() > deadline:
                    raise
                if not announced:
                    print(f"waiting to measure alone: {busy}", flush=True)
                    announced = True
                time.sleep(1)
        with held:
            yield
    finally:
        MEASURING_FLAG.unlink(missing_ok=True)


def format_load(load: tuple[float, ...]) -> str:
    """The 1/5/15-minute load averages: "0.52 / 0.61 / 0.70"."""
    return " / ".join(f"{x:.2f}" for x in load)


def print_load_average(when: str) -> tuple[float, float, float]:
    """Print the load average now ("load average at the <when>: ..."), and return it."""
    load = os.getloadavg()
    print(f"load average at the {when}: {format_load(load)}", flush=True)
    return load


def wait_for_quiet(threshold: float, *, wait_s: float = 900.0,
                   poll_s: float = 20.0) -> tuple[float, float, float]:
    """Wait (up to `wait_s`) for the 1-minute load average to fall below `threshold`; the load
    average then, printed."""
    deadline = time.monotonic() + wait_s
    while os.getloadavg()[0] >= threshold and time.monotonic() < deadline:
        print(f"waiting for a quiet machine: load average {os.getloadavg()[0]:.2f}", flush=True)
        time.sleep(poll_s)
    return print_load_average("start")


@contextlib.contextmanager
def alone(quiet_load: float = 1.5, **measurement_options) -> Iterator[tuple[float, float, float]]:
    """A timed measurement: hold the lock and the flag, start on a quiet machine (the load
    average printed and given), and print the load average again at the end."""
    with measurement(**measurement_options):
        yield wait_for_quiet(quiet_load)
        print_load_average("end")
