"""A host's blockq processes: the local stack's (`app.cli.stack.Stack`), each started in the
host's network namespace under the host's own hostname (a UTS namespace of its own), so that
Celery's node names (`predict@ctl-a`) and the data directories are the host's.

Killing a host SIGKILLs every process group of it at once and stops its supervisor, as a power
loss would; starting it again is the host's reboot: the same processes, supervised again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from app.cli.stack import Stack
from benchmarks.multihost.network import in_namespace

#: Runs the rest of the command line with the hostname given as $0 (in a new UTS namespace).
_WITH_HOSTNAME = 'hostname "$0" && exec "$@"'
#: Holds the sitecustomize that offsets a Python process's wall clock (its docstring says how).
SKEWED_CLOCK_DIR = Path(__file__).resolve().parent / "skewed_clock"


def skewed_env(env: dict[str, str], offset_s: float) -> dict[str, str]:
    """`env` for Python processes whose wall clock reads `offset_s` seconds off; their
    monotonic clocks, sleeps and timeouts are untouched (as NTP drift leaves them)."""
    path = os.pathsep.join(filter(None, [str(SKEWED_CLOCK_DIR), env.get("PYTHONPATH")]))
    return {**env, "PYTHONPATH": path, "MULTIHOST_CLOCK_OFFSET_S": str(offset_s)}


def host_command(host: str, command: list[str]) -> list[str]:
    """`command` as host `host` runs it: in its network namespace, under its hostname."""
    return [*in_namespace(host), "unshare", "--uts", "--", "sh", "-c", _WITH_HOSTNAME, host,
            *command]


@dataclass
class HostStack(Stack):
    """The stack's processes of one host (see the module docstring)."""

    host: str = ""
    #: Each log's size when the host last booted: what it logs since is this boot's.
    _boot_offsets: dict[str, int] = field(default_factory=dict, repr=False)

    def start_process(self, name: str, command: list[str]) -> None:
        # The supervisor restarts a process from self.commands: keep the plain command there.
        with self._lock:
            super().start_process(name, host_command(self.host, command))
            self.commands[name] = command

    def kill_host(self) -> list[int]:
        """SIGKILL every process of the host at once, with no restart; their pids."""
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join()
            self._supervisor = None
        with self._lock:
            processes = list(self.processes.values())
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)
        return [p.pid for p in processes]

    def boot(self, names: list[str]) -> None:
        """Start the host's processes and supervise them (a first start or a reboot)."""
        self._boot_offsets = {name: _size(self.log_dir / f"{name}.log") for name in names}
        self.start(names=names)
        self.supervise()

    def workers_ready(self) -> bool:
        """Every Celery worker of the host logged ' ready.' since it last booted (beat and
        the API have no such line)."""
        for name, offset in self._boot_offsets.items():
            if "worker" not in self.commands.get(name, []):
                continue
            try:
                with (self.log_dir / f"{name}.log").open("rb") as log:
                    log.seek(offset)
                    if b" ready." not in log.read():
                        return False
            except OSError:
                return False
        return True

    def all_running(self) -> bool:
        with self._lock:
            return bool(self.processes) and all(
                p.poll() is None for p in self.processes.values())


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
