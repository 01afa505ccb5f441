"""Every exit of a stack process, and the fault that caused it if one did; a process log's
last error line."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from app.cli.stack import Stack


@dataclass
class Exit:
    name: str
    pid: int
    code: int | None
    at: float  # wall time it was noticed
    cause: str | None  # the fault kind that signalled it, or None: it died by itself


class ProcessWatch:
    """Notices every exit of a stack process (its code, and the fault that caused it if one
    did) by polling `stack.processes`, where the supervisor puts each restarted process."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.exits: list[Exit] = []
        self.signalled: dict[int, str] = {}  # pid -> fault kind
        self.known: dict[str, subprocess.Popen[bytes]] = dict(stack.processes)
        self.recorded: set[int] = set()  # pids whose exit is noted
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="process-watch", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)

    def signal(self, name: str, sig: int, cause: str) -> None:
        """Sends `sig` to the process `name` (Stack.signal) and notes why."""
        process = self.stack.processes[name]
        with self.lock:
            self.signalled[process.pid] = cause
        self.stack.signal(name, sig)

    def forget(self, name: str) -> None:
        """The signal sent to `name` did not end it (SIGSTOP, then SIGCONT)."""
        with self.lock:
            self.signalled.pop(self.stack.processes[name].pid, None)

    def all_running(self) -> bool:
        return all(p.poll() is None for p in list(self.stack.processes.values()))

    def _run(self) -> None:
        while not self.stopping.wait(0.1):
            now = time.time()
            for name, process in list(self.stack.processes.items()):
                known = self.known.get(name)
                if known is not None and known is not process:  # the supervisor restarted it
                    self._exited(name, known, now)
                    self.known[name] = process
                if process.poll() is not None:
                    self._exited(name, process, now)

    def _exited(self, name: str, process: subprocess.Popen[bytes], now: float) -> None:
        if process.pid in self.recorded:
            return
        self.recorded.add(process.pid)
        with self.lock:
            cause = self.signalled.pop(process.pid, None)
            self.exits.append(Exit(name, process.pid, process.poll(), now, cause))


def log_tail(path: Path, before: float) -> str:
    """The last error-looking line a process log got up to `before` (wall time): mostly why
    the process died. Lines that are not JSON (gunicorn's own, tracebacks) have no time."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines[-2000:]):
        if not any(w in line for w in ("Error", "error", "Unrecoverable", "in use", "Exit")):
            continue
        try:
            if datetime.fromisoformat(json.loads(line)["time"]).timestamp() > before:
                continue
        except (ValueError, KeyError, TypeError):
            pass
        return line.strip()[:300]
    return ""
