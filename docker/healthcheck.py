"""Container health checks of the blockq images: `python docker/healthcheck.py <check>`.

api     the API answers GET /readyz with 200 (its database and broker answer).
worker  a Celery worker of this container answers a ping. An engine worker builds its engine
        before it consumes anything, so it answers only once the engine is up.
beat    the beat schedule file changed recently: beat rewrites it every few minutes when it
        sends a periodic task, and it sends the orphan sweep every few seconds.
flower  Flower answers GET /healthcheck with 200.

Exit status 0 when healthy, 1 when not, as Docker's HEALTHCHECK expects; the reason goes to
stderr, which `docker inspect` shows.
"""

from __future__ import annotations

import socket
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from domain.settings import Settings

__all__ = ["CHECKS", "beat_schedule_fresh", "main"]

#: Timeout of one probe; HEALTHCHECK --timeout must leave room for the imports too.
PROBE_TIMEOUT_S = 5.0
#: Celery beat writes its schedule when it sends a task 3 minutes or more after its last write;
#: the check allows this much, plus the orphan sweep's period.
BEAT_MAX_AGE_S = 600.0
#: The schedule file beat is started with (`celery -A workers beat -s <data dir>/<this>`).
BEAT_SCHEDULE_NAME = "celerybeat-schedule"
FLOWER_PORT = 5555


def http_ok(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except OSError as exc:  # URLError and HTTPError are OSErrors
        print(f"GET {url}: {exc}", file=sys.stderr)
        return False


def worker_answers(timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a worker named <anything>@<this container's hostname> answers a ping."""
    from workers.celery import celery  # noqa: PLC0415 - builds the Celery app; workers only

    pattern = f"*@{socket.gethostname()}"
    try:
        replies = celery.control.ping(timeout=timeout_s, pattern=pattern, matcher="glob")
    except Exception as exc:  # noqa: BLE001 - any failure to reach the broker is unhealthy
        print(f"ping {pattern}: {exc!r}", file=sys.stderr)
        return False
    if not replies:
        print(f"no worker {pattern} answered within {timeout_s} s", file=sys.stderr)
    return bool(replies)


def beat_schedule_fresh(schedule: Path, max_age_s: float = BEAT_MAX_AGE_S) -> bool:
    """Whether a file of the schedule changed within max_age_s (dbm may add a suffix)."""
    files = list(schedule.parent.glob(f"{schedule.name}*"))
    if not files:
        print(f"no beat schedule at {schedule}", file=sys.stderr)
        return False
    age_s = time.time() - max(path.stat().st_mtime for path in files)
    if age_s > max_age_s:
        print(f"beat schedule {schedule} unchanged for {age_s:.0f} s", file=sys.stderr)
    return age_s <= max_age_s


CHECKS: dict[str, Callable[[Settings], bool]] = {
    "api": lambda s: http_ok(f"http://127.0.0.1:{s.api_port}/readyz"),
    "worker": lambda s: worker_answers(),
    "beat": lambda s: beat_schedule_fresh(
        s.data_dir / BEAT_SCHEDULE_NAME, BEAT_MAX_AGE_S + s.orphan_check_interval_s
    ),
    "flower": lambda s: http_ok(f"http://127.0.0.1:{FLOWER_PORT}/healthcheck"),
}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in CHECKS:
        print(f"usage: healthcheck.py {{{','.join(CHECKS)}}}", file=sys.stderr)
        return 2
    return 0 if CHECKS[argv[0]](Settings.load()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
