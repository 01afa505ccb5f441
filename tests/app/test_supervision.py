"""Stack supervision on stand-in processes (no services): a process that dies is restarted and
logged, the others keep running, and `stop()` restarts nothing."""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.cli.stack import LOW_PRIORITY, Stack, StackError, describe_exit
from domain.settings import Settings

#: A process that prints a line and then waits to be stopped, like a worker.
SLEEPER = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"]


def eventually(condition: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """A stack of two stand-in processes, 'worker' and 'api', stopped after the test."""
    stack = Stack(Settings(data_dir=tmp_path), env={})
    stack.log_dir.mkdir(parents=True)
    for name in ("worker", "api"):
        stack.start_process(name, SLEEPER)
    yield stack
    stack.stop(timeout_s=5)


def test_a_killed_process_is_restarted_and_the_others_keep_running(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="app.cli.stack")
    stack.supervise()
    first, api = stack.processes["worker"], stack.processes["api"]
    log = stack.log_dir / "worker.log"
    assert eventually(lambda: log.read_text().count("up") == 1)

    stack.signal("worker", signal.SIGKILL)

    assert eventually(lambda: stack.restart_count("worker") == 1)
    restarted = stack.processes["worker"]
    assert restarted.pid != first.pid and restarted.poll() is None
    assert stack.processes["api"] is api and api.poll() is None
    stack.check_alive()  # supervised: a restart is not a failure
    messages = [record.getMessage() for record in caplog.records]
    assert any("worker" in m and "signal SIGKILL" in m for m in messages)
    assert any("worker restarted" in m and "restart 1" in m for m in messages)
    # The new process's output is appended to the same log.
    assert eventually(lambda: log.read_text().count("up") == 2)


def test_a_process_that_keeps_dying_is_restarted_each_time(stack: Stack) -> None:
    stack.supervise()
    for attempt in (1, 2, 3):
        stack.signal("worker", signal.SIGTERM)
        assert eventually(lambda n=attempt: stack.restart_count("worker") == n)
        assert eventually(lambda: stack.processes["worker"].poll() is None)
    assert stack.restart_count("api") == 0


def test_stop_ends_supervision_first_nothing_is_restarted(stack: Stack) -> None:
    stack.supervise()
    processes = list(stack.processes.values())

    stack.stop(timeout_s=5)

    assert stack.processes == {}
    assert all(process.poll() is not None for process in processes)
    assert stack.restart_count("worker") == 0 and stack.restart_count("api") == 0


def test_unsupervised_a_dead_process_fails_check_alive(stack: Stack) -> None:
    stack.kill("worker")
    with pytest.raises(StackError, match="'worker' exited with signal SIGKILL"):
        stack.check_alive()


def test_exits_are_described_by_code_or_signal() -> None:
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-signal.SIGKILL) == "signal SIGKILL"


def test_a_process_that_ignores_sigterm_is_killed_after_its_grace(tmp_path: Path) -> None:
    stack = Stack(Settings(data_dir=tmp_path), env={})
    stack.log_dir.mkdir(parents=True)
    stubborn = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                "signal.SIG_IGN); print('up', flush=True); time.sleep(600)"]
    stack.start_process("stubborn", stubborn)
    process = stack.processes["stubborn"]
    assert eventually(lambda: "up" in (stack.log_dir / "stubborn.log").read_text())

    stack.stop(timeout_s=0.5)

    assert process.returncode == -signal.SIGKILL


def test_engine_workers_get_the_longer_grace(tmp_path: Path) -> None:
    stack = Stack(Settings(data_dir=tmp_path, num_instances=2), env={})
    assert stack.stop_grace_s("gpu.1") > stack.stop_grace_s("route")


def test_what_a_killed_process_left_in_its_group_is_killed_before_the_restart(
    stack: Stack, tmp_path: Path
) -> None:
    # Like gunicorn: a master whose worker (a child in its process group) would keep the port.
    pid_file = tmp_path / "child.pid"
    master = [sys.executable, "-c",
              "import subprocess, sys, time; "
              f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
              f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(600)"]
    stack.start_process("master", master)
    assert eventually(lambda: pid_file.exists() and pid_file.read_text() != "")
    child_pid = int(pid_file.read_text())
    stack.supervise()

    stack.signal("master", signal.SIGKILL)

    assert eventually(lambda: stack.restart_count("master") == 1)
    assert eventually(lambda: not _running(child_pid))


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"  # a zombie is dead, waiting to be reaped
    except FileNotFoundError:
        return False


def test_kill_all_ends_every_process_at_once_even_one_ignoring_sigterm(tmp_path: Path) -> None:
    stack = Stack(Settings(data_dir=tmp_path), env={})
    stack.log_dir.mkdir(parents=True)
    stubborn = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                "signal.SIG_IGN); time.sleep(600)"]
    stack.start_process("stubborn", stubborn)
    stack.start_process("worker", SLEEPER)
    stack.supervise()
    processes = list(stack.processes.values())
    started = time.monotonic()

    stack.kill_all()

    assert time.monotonic() - started < 5  # no grace waited for
    assert all(process.returncode == -signal.SIGKILL for process in processes)
    assert stack.processes == {} and not stack.supervising
    assert stack.restart_count("worker") == 0


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no autogroup scheduling")
def test_a_low_priority_process_gets_a_niced_session(tmp_path: Path) -> None:
    """Each stack process has a session (so an autogroup) of its own: `nice` alone would not
    lower its CPU share against the API's, so the session is niced too."""
    stack = Stack(Settings(data_dir=tmp_path), env={})
    stack.log_dir.mkdir(parents=True)
    try:
        stack.start_process("batches", SLEEPER)
        stack.start_process("api", SLEEPER)
        batches = Path(f"/proc/{stack.processes['batches'].pid}/autogroup").read_text()
        api = Path(f"/proc/{stack.processes['api'].pid}/autogroup").read_text()
        assert batches.split()[0] != api.split()[0]  # sessions of their own
        assert batches.split()[-1] == str(LOW_PRIORITY["batches"])
        assert api.split()[-1] == "0"
    finally:
        stack.stop(timeout_s=5)
