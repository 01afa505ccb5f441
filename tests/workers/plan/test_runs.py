"""`workers.plan.runs.Runner`: runs a search waits on go before runs asked for ahead of need;
a run asked for ahead moves up when a search comes to wait on it, and is dropped when the
search moved past it before it started."""

from __future__ import annotations

import os
import time
from pathlib import Path

from workers.plan.runs import Runner


def _note(path: str, name: str, until: str | None = None) -> str:
    """Append `name` to the file at `path` (the order runs start in), then hold the worker
    until the file `until` exists."""
    with open(path, "a") as notes:
        notes.write(name + "\n")
    while until is not None and not os.path.exists(until):
        time.sleep(0.01)
    return name


def _wait_for_lines(path: Path, count: int) -> None:
    deadline = time.monotonic() + 30
    while not path.exists() or len(path.read_text().split()) < count:
        assert time.monotonic() < deadline, f"fewer than {count} runs started"
        time.sleep(0.01)


def test_without_worker_processes_a_run_is_done_when_submitted(tmp_path: Path) -> None:
    notes = tmp_path / "started"
    with Runner(1) as runner:
        assert not runner.parallel
        run = runner.submit(_note, str(notes), "now")
        assert run.done() and run.result() == "now"
        failing = runner.submit(os.path.getsize, str(tmp_path / "missing"))
        assert isinstance(failing.exception(), FileNotFoundError)


def test_needed_runs_go_before_runs_ahead_and_a_hurried_one_moves_up(tmp_path: Path) -> None:
    notes = tmp_path / "started"
    with Runner(2) as runner:
        # Two runs hold both workers while the queue fills up.
        release = tmp_path / "release"
        holding = [runner.submit(_note, str(notes), f"hold{i}", str(release)) for i in range(2)]
        _wait_for_lines(notes, 2)
        ahead = [runner.submit(_note, str(notes), f"ahead{i}", ahead=True) for i in range(3)]
        needed = runner.submit(_note, str(notes), "needed")
        runner.hurry(ahead[2])
        assert runner.withdraw(ahead[1])
        assert not runner.withdraw(needed)  # only a run asked for ahead is withdrawn
        release.touch()
        for run in [*holding, needed, ahead[0], ahead[2]]:
            run.result(timeout=30)
        assert ahead[1].cancelled()
    started = notes.read_text().split()
    assert started[2:] == ["needed", "ahead2", "ahead0"]
