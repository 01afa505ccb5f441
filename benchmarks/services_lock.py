"""One test run at a time on a test database and Redis db.

Every run empties and recreates the test PostgreSQL database and flushes the test Redis db, so
two runs on the same ones wreck each other's tests (a CI run beside a developer's, a developer's
run beside a benchmark). A run that needs the services holds an exclusive lock per service URL
(`flock` on a file named after it, released by the kernel when the run dies); a second run
stops at once and says which URL is taken and how to pick another.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from contextlib import ExitStack
from pathlib import Path

from sqlalchemy.engine import make_url


class ServicesBusy(RuntimeError):
    """Another process holds a test service."""


def lock_path(url: str) -> Path:
    """The lock file of one service URL, named by a digest (no password reaches a file name)."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"blockq-test-services-{digest}.lock"


def hold(urls: dict[str, str]) -> ExitStack:
    """Takes the lock of each `name -> url`; they are held until the returned stack closes.
    Raises ServicesBusy naming the first URL another process holds (and the variable that
    moves this run elsewhere), having let go of those it took."""
    with ExitStack() as held:
        for variable, url in urls.items():
            handle = held.enter_context(lock_path(url).open("a+"))
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                owner = handle.read().strip() or "unknown"
                raise ServicesBusy(
                    f"another test run (pid {owner}) is using "
                    f"{make_url(url).render_as_string(hide_password=True)}; wait for it, or "
                    f"give this run its own with {variable}") from None
            handle.truncate(0)
            handle.write(str(os.getpid()))
            handle.flush()
        return held.pop_all()
