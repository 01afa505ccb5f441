"""One local stack per data directory: a lock file that every process of the stack holds.

The supervisor opens data_dir/stack.lock, takes an exclusive flock on it, and hands the open file
to every process it starts (`pass_fds`). An flock belongs to the open file, not to a process: it
stays taken while any process holding the file lives, the supervisor, its children, or their
children (gunicorn's workers). So a second `blockq serve` on the same data directory is refused
while anything of the first runs, even when the first supervisor was SIGKILLed and only orphans
are left, and it is free again the moment the last of them exits.

The file's text names the processes (JSON: the supervisor's pid and each process's name and
pid), rewritten at every start and restart; the refusal and `blockq stop` read it, and find the
holders themselves in /proc (an orphaned gunicorn worker is in no record).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LOCK_FILE", "StackHolder", "StackLock", "StackRunning", "lock_holders", "stop_stack"]

#: The lock file's name in the data directory.
LOCK_FILE = "stack.lock"
#: How often `stop_stack` looks whether the holders have exited.
STOP_POLL_S = 0.2


class StackRunning(RuntimeError):
    """Another stack's processes hold the data directory; the message names them."""


@dataclass(frozen=True)
class StackHolder:
    """A live process holding a stack's lock."""

    pid: int
    #: The stack's name for it ('api', 'gpu.0', 'supervisor'), or its command line.
    name: str

    def __str__(self) -> str:
        return f"{self.name} (pid {self.pid})"


class StackLock:
    """The lock of one data directory, held by this process and the processes it starts."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None
        self._pids: dict[str, int] = {}

    @property
    def fd(self) -> int | None:
        """The open lock file, to pass to each child (None until acquired)."""
        return self._fd

    def acquire(self) -> None:
        """Take the lock, or raise StackRunning naming the processes that hold it."""
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holders = lock_holders(self.path.parent)
            names = ", ".join(map(str, holders)) or "processes that exited just now"
            raise StackRunning(
                f"another blockq stack runs on {self.path.parent}: {names}; "
                "stop it with `blockq stop` (same settings), or use another BLOCKQ_DATA_DIR"
            ) from None
        self._fd = fd
        self._pids = {}
        self._write()

    def record(self, name: str, pid: int) -> None:
        """Note that process `name` now runs as `pid` (a start or a restart)."""
        if self._fd is None:
            return
        self._pids[name] = pid
        self._write()

    def release(self) -> None:
        """Close this process's copy; the lock is free once no child holds one either."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)
        self._fd = None

    def _write(self) -> None:
        assert self._fd is not None
        text = json.dumps({"supervisor": os.getpid(), "processes": self._pids}).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, text, 0)


def _recorded_names(path: Path) -> dict[int, str]:
    """pid -> name from the lock file's text ({} if it is absent or unreadable)."""
    try:
        record = json.loads(path.read_text())
        names = {int(pid): name for name, pid in record.get("processes", {}).items()}
        names[int(record["supervisor"])] = "supervisor"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    return names


def _holds(pid: str, path: Path) -> bool:
    with contextlib.suppress(OSError):
        for fd in os.scandir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(fd.path) == str(path):
                    return True
    return False


def _command_line(pid: int) -> str:
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    return " ".join(word.decode(errors="replace") for word in words if word)[:80]


def lock_holders(data_dir: Path) -> list[StackHolder]:
    """The live processes holding data_dir's stack lock, this process left out, by pid."""
    path = (data_dir / LOCK_FILE).resolve()
    names = _recorded_names(path)
    holders = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid() and _holds(entry.name, path):
            pid = int(entry.name)
            holders.append(StackHolder(pid, names.get(pid) or _command_line(pid)))
    return sorted(holders, key=lambda holder: holder.pid)


def _signal_all(holders: list[StackHolder], sig: int) -> None:
    for holder in holders:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(holder.pid, sig)


def _wait_gone(data_dir: Path, deadline: float) -> list[StackHolder]:
    """Until nothing holds the lock or the deadline passes; what still holds it."""
    while (holders := lock_holders(data_dir)) and time.monotonic() < deadline:
        time.sleep(STOP_POLL_S)
    return holders


def stop_stack(data_dir: Path, timeout_s: float) -> tuple[list[StackHolder], list[StackHolder]]:
    """Stop the stack holding data_dir: (the processes found, those that had to be SIGKILLed).

    A live supervisor gets SIGTERM and stops its processes softly itself (`Stack.stop`); without
    one (it was killed), every holder gets SIGTERM, their own warm shutdown. Whatever still holds
    the lock after `timeout_s` is SIGKILLed.
    """
    found = lock_holders(data_dir)
    supervisors = [holder for holder in found if holder.name == "supervisor"]
    _signal_all(supervisors or found, signal.SIGTERM)
    left = _wait_gone(data_dir, time.monotonic() + timeout_s)
    _signal_all(left, signal.SIGKILL)
    _wait_gone(data_dir, time.monotonic() + 10.0)
    return found, left
