"""A script that starts a stack and is stopped with SIGTERM stops its stack's processes
(`stop_stacks_on_sigterm`: its `finally` blocks run); without it they still die with the script,
by their parent-death signal, though in sessions of their own."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: A script holding a one-process stack (a stand-in sleeper) until it is stopped.
SCRIPT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from app.cli.stack import Stack, stop_stacks_on_sigterm
    from domain.settings import Settings

    if sys.argv[2] == "handled":
        stop_stacks_on_sigterm()
    stack = Stack(Settings(data_dir=Path(sys.argv[1])), env={})
    stack.log_dir.mkdir(parents=True)
    stack.start_process("worker", [sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        print(stack.processes["worker"].pid, flush=True)
        time.sleep(600)
    finally:
        stack.stop(timeout_s=5)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is gone for our purpose.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z"


def _stack_child_after_sigterm(tmp_path: Path, mode: str) -> int:
    """The stand-in worker's pid, after the script holding it was sent SIGTERM and exited."""
    script = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path), mode],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert script.stdout is not None
    child = int(script.stdout.readline())
    assert _alive(child)
    script.send_signal(signal.SIGTERM)
    script.wait(timeout=30)
    return child


def test_sigterm_stops_the_scripts_stack(tmp_path: Path) -> None:
    child = _stack_child_after_sigterm(tmp_path, "handled")
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_without_it_the_stack_still_dies_with_the_script(tmp_path: Path) -> None:
    """The default SIGTERM skips `finally`: the parent-death signal stops the child instead."""
    child = _stack_child_after_sigterm(tmp_path, "default")
    try:
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
