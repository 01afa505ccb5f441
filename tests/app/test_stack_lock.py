"""A killed supervisor takes its stack with it, and one data directory runs one stack.

On stand-in processes (no services): a sleeper, one that ignores SIGTERM, and a real gunicorn
(whose workers are the supervisor's grandchildren), held by a script that is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import main
from app.cli.stack import Stack, StackError, free_port
from app.cli.stack_lock import lock_holders
from domain.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
#: A process whose warm shutdown never ends: only SIGKILL stops it.
STUBBORN = [sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ignoring', flush=True); time.sleep(600)"]

#: A script holding a stack of the commands in argv[2] (JSON) until it is killed.
SCRIPT = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from app.cli.stack import Stack
    from domain.settings import Settings

    stack = Stack(Settings(data_dir=Path(sys.argv[1])), env=dict(__import__("os").environ))
    stack.hold_data_dir()
    stack.log_dir.mkdir(parents=True)
    for name, command in json.loads(sys.argv[2]).items():
        stack.start_process(name, command)
    stack.supervise()  # restarts come from the supervisor thread: they must die with us too
    print(json.dumps({name: p.pid for name, p in stack.processes.items()}), flush=True)
    time.sleep(600)
""")

WSGI_APP = "def app(environ, start_response):\n    start_response('200 OK', [])\n    return [b'']\n"


def eventually(condition: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().split(") ", 1)[1][0] != "Z"  # a zombie is gone for our purpose
    except (OSError, IndexError):
        return False


@pytest.fixture
def holders_killed(tmp_path: Path) -> Iterator[None]:
    """Whatever still holds tmp_path's lock after the test is SIGKILLed."""
    yield
    for holder in lock_holders(tmp_path):
        with contextlib.suppress(ProcessLookupError):
            os.kill(holder.pid, signal.SIGKILL)


def _start_script(data_dir: Path, commands: dict[str, list[str]]) -> tuple[subprocess.Popen[str],
                                                                          dict[str, int]]:
    import json

    script = subprocess.Popen([sys.executable, "-c", SCRIPT, str(data_dir), json.dumps(commands)],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert script.stdout is not None
    return script, json.loads(script.stdout.readline())


def _gunicorn(tmp_path: Path) -> list[str]:
    (tmp_path / "tiny_wsgi.py").write_text(WSGI_APP)
    return [str(Path(sys.executable).parent / "gunicorn"), "--chdir", str(tmp_path),
            "--bind", f"127.0.0.1:{free_port()}", "--workers", "2", "--no-control-socket",
            "tiny_wsgi:app"]


def _gunicorn_workers(master: int) -> list[int]:
    children = Path(f"/proc/{master}/task/{master}/children")
    with contextlib.suppress(OSError):
        return [int(pid) for pid in children.read_text().split()]
    return []


def test_a_killed_supervisor_takes_its_whole_stack_with_it(
    tmp_path: Path, holders_killed: None
) -> None:
    script, pids = _start_script(tmp_path, {"worker": SLEEPER, "api": _gunicorn(tmp_path)})
    assert eventually(lambda: len(_gunicorn_workers(pids["api"])) == 2)
    workers = _gunicorn_workers(pids["api"])
    assert {h.pid for h in lock_holders(tmp_path)} >= {script.pid, *pids.values(), *workers}

    script.send_signal(signal.SIGKILL)
    script.wait(timeout=30)

    assert eventually(lambda: not lock_holders(tmp_path)), lock_holders(tmp_path)
    assert not [pid for pid in (*pids.values(), *workers) if _alive(pid)]


def test_a_second_stack_on_the_data_dir_is_refused_until_blockq_stop(
    tmp_path: Path, holders_killed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    script, pids = _start_script(tmp_path, {"stubborn": STUBBORN})
    log = tmp_path / "logs" / "stubborn.log"
    assert eventually(lambda: log.exists() and "ignoring" in log.read_text())
    script.send_signal(signal.SIGKILL)  # its parent-death SIGTERM is ignored: an orphan stays
    script.wait(timeout=30)

    second = Stack(Settings(data_dir=tmp_path), env={})
    with pytest.raises(StackError) as refused:
        second.start(names=[])
    assert f"stubborn (pid {pids['stubborn']})" in str(refused.value)
    assert "blockq stop" in str(refused.value)

    monkeypatch.setenv("BLOCKQ_DATA_DIR", str(tmp_path))
    serve = CliRunner().invoke(main, ["serve"])  # refused before it prepares anything
    assert serve.exit_code == 1 and "another blockq stack runs" in serve.output
    assert f"stubborn (pid {pids['stubborn']})" in serve.output

    result = CliRunner().invoke(main, ["stop", "--timeout", "1"])

    assert result.exit_code == 0, result.output
    assert f"stubborn (pid {pids['stubborn']})" in result.output and "SIGKILLed" in result.output
    assert not _alive(pids["stubborn"])
    second.start(names=[])  # free again
    second.stop(timeout_s=5)
    assert "no blockq stack runs" in CliRunner().invoke(main, ["stop"]).output
