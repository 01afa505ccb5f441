"""Every exit of a stack process, and the fault that caused it if one did; a process log's
last error line."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from app.cli.stack import Stack

#: The cause of an engine's exit after the autoscaler drained and stopped it (SIGTERM, the warm
#: shutdown: exit 0, or the signal itself).
DRAINED = "autoscale:drained"
DRAINED_EXITS = (0, -signal.SIGTERM)


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
        self.released: set[int] = set()  # pids the stack let go (the autoscaler drains them)
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

    def signal_process(self, process: subprocess.Popen[bytes], sig: int, cause: str) -> None:
        """Sends `sig` to a process the stack no longer supervises (an engine the autoscaler
        drains) and notes why."""
        self.expect(process.pid, cause)
        if process.poll() is None:
            process.send_signal(sig)

    def expect(self, pid: int, cause: str) -> None:
        """The exit of process `pid` is the fault `cause`'s doing."""
        with self.lock:
            self.signalled[pid] = cause

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
                if known is not process:  # restarted by the supervisor, or a new slot started
                    if known is not None:
                        self._exited(name, known, now)
                    self.known[name] = process
                if process.poll() is not None:
                    self._exited(name, process, now)
            for name, known in list(self.known.items()):
                if name in self.stack.processes and self.stack.processes[name] is known:
                    continue
                # Released by the autoscaler (drained, then stopped), or stopped whole.
                self.released.add(known.pid)
                if known.poll() is not None:
                    self._exited(name, known, now)
                    del self.known[name]

    def _exited(self, name: str, process: subprocess.Popen[bytes], now: float) -> None:
        if process.pid in self.recorded:
            return
        self.recorded.add(process.pid)
        with self.lock:
            cause = self.signalled.pop(process.pid, None)
            if cause is None and process.pid in self.released \
                    and process.poll() in DRAINED_EXITS:
                cause = DRAINED
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
