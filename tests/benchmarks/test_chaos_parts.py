"""The chaos harness's pure parts (`benchmarks.chaos`): the fault kinds of a stack, the
schedule, the crash-after-commit faults read back from the logs, the summary per fault kind.
The whole run is tests/stack/test_chaos.py."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from benchmarks.chaos.faults import (
    CRASH_AFTER_COMMIT_LINE,
    Fault,
    crash_faults,
    fault_kinds,
    schedule_faults,
)
from benchmarks.chaos.processes import DRAINED, ProcessWatch
from benchmarks.chaos.scaling import SCALE_KINDS, SlotView, drain_target, start_target
from benchmarks.chaos.summaries import summarize_faults
from domain.settings import Settings


def test_every_process_kind_can_be_killed_and_engines_group_as_gpu(tmp_path: Path) -> None:
    kinds = fault_kinds(Settings(data_dir=tmp_path, num_instances=3))
    assert {"sigkill:gpu", "sigterm:gpu", "sigkill:api", "sigkill:route", "sigstop:gpu",
            "redis:restart-empty", "control:no-fault"} <= set(kinds)
    assert not any(k.endswith(("gpu.0", "gpu.1", "flower")) for k in kinds)
    assert len(kinds) == len(set(kinds))


def test_the_schedule_has_each_kind_as_often_as_asked_in_a_seeded_order() -> None:
    kinds = ["sigkill:api", "redis:restart-empty", "sigstop:gpu"]
    schedule = schedule_faults(kinds, 4, random.Random(3))
    assert Counter(schedule) == dict.fromkeys(kinds, 4)
    assert schedule == schedule_faults(kinds, 4, random.Random(3))
    assert schedule != sorted(schedule)


def test_crashes_after_a_commit_are_read_from_the_json_logs(tmp_path: Path) -> None:
    line = {"time": "2026-12-07T03:00:00+00:00", "message": CRASH_AFTER_COMMIT_LINE}
    (tmp_path / "predict.log").write_text(
        "not json " + CRASH_AFTER_COMMIT_LINE + "\n" + json.dumps(line) + "\n"
        + json.dumps({"time": "later", "message": "other"}) + "\n")
    (tmp_path / "api.log").write_text("")
    faults = crash_faults(tmp_path)
    assert [(f.kind, f.target) for f in faults] == [("crash-after-commit", "predict")]
    assert faults[0].start == faults[0].end == 1796612400.0


def test_recovery_is_summarized_per_fault_kind() -> None:
    faults = [Fault("sigkill:api", "api", 0.0, 1.0, fleet_back_s=2.0),
              Fault("sigkill:api", "api", 5.0, 6.0, fleet_back_s=4.0),
              Fault("redis:restart-empty", "redis", 9.0, 10.0, fleet_back_s=None)]
    recovery = [(3, 1.5, None), (0, None, None), (2, None, "stuck")]
    redis, api = summarize_faults(faults, recovery)  # by kind
    assert api == {"kind": "sigkill:api", "injected": 2, "in_flight": 3, "never_recovered": 0,
                   "recovery_p50_s": 1.5, "recovery_max_s": 1.5, "fleet_back_p50_s": 3.0,
                   "fleet_back_max_s": 4.0, "fleet_not_back": 0}
    assert redis["never_recovered"] == 1 and redis["fleet_not_back"] == 1
    assert redis["recovery_p50_s"] is None


def test_an_autoscaled_fleet_adds_the_scale_fault_kinds(tmp_path: Path) -> None:
    fixed = fault_kinds(Settings(data_dir=tmp_path, num_instances=2))
    scaled = fault_kinds(Settings(data_dir=tmp_path, num_instances=2, autoscale=True))
    assert not set(SCALE_KINDS) & set(fixed)
    assert scaled == fixed + SCALE_KINDS
    assert {"scale:down-under-load", "scale:up-during-redis-restart", "scale:supervisor-killed",
            "scale:engine-killed-draining"} == set(SCALE_KINDS)


def test_a_forced_drain_takes_the_busiest_running_engine_and_never_the_last() -> None:
    slots = [SlotView("gpu.0", "running", 3), SlotView("gpu.1", "running", 5),
             SlotView("gpu.2", "starting"), SlotView("gpu.3", "stopped")]
    assert drain_target(slots) == "gpu.1"
    assert drain_target([SlotView("gpu.0", "running", 1), SlotView("gpu.1", "running", 1)]) \
        == "gpu.1"  # a tie: the newest slot
    assert drain_target([SlotView("gpu.0", "running", 9), SlotView("gpu.1", "draining", 2),
                         SlotView("gpu.2", "starting")]) is None  # the only running one


def test_a_forced_start_takes_the_lowest_stopped_slot() -> None:
    slots = [SlotView("gpu.10", "stopped"), SlotView("gpu.2", "stopped"),
             SlotView("gpu.0", "running")]
    assert start_target(slots) == "gpu.2"
    assert start_target([SlotView("gpu.0", "running"), SlotView("gpu.1", "draining")]) is None


def test_an_engine_the_autoscaler_let_go_exits_as_drained_unless_it_crashed() -> None:
    """The watch follows processes the stack no longer supervises: a warm shutdown after a
    drain is expected, a crash while draining is not, and a fault's kill is the fault's."""
    processes = {name: subprocess.Popen(["sleep", "30"]) for name in ("gpu.0", "gpu.1", "gpu.2")}
    stack = SimpleNamespace(processes=dict(processes))
    watch = ProcessWatch(stack)  # type: ignore[arg-type]
    watch.start()
    try:
        for name in processes:
            stack.processes.pop(name)  # Stack.release
        deadline = time.monotonic() + 5
        while len(watch.released) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        processes["gpu.0"].send_signal(signal.SIGTERM)  # the drain's warm shutdown
        subprocess.run(["kill", "-SEGV", str(processes["gpu.1"].pid)], check=True)
        watch.signal_process(processes["gpu.2"], signal.SIGKILL, "scale:engine-killed-draining")
        while len(watch.exits) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watch.stop()
        for process in processes.values():
            process.kill()
            process.wait()
    causes = {e.name: e.cause for e in watch.exits}
    assert causes == {"gpu.0": DRAINED, "gpu.1": None, "gpu.2": "scale:engine-killed-draining"}


def test_a_fenced_generate_left_in_a_stopped_queue_is_told_apart_from_a_lost_one() -> None:
    """A scaled-down instance's queue keeping one generate message of an attempt its request has
    since passed (it finished elsewhere) is not a leftover; any other message is."""
    from types import SimpleNamespace

    from benchmarks.chaos.checks import _only_a_fenced_generate

    entry = ("gpu.0[0]: 1 waiting, oldest serve.generate[27bd0cb5] "
             "argsrepr=['req_abc', 1]")
    finished = {"req_abc": SimpleNamespace(attempt=2, status="succeeded")}
    assert _only_a_fenced_generate(entry, finished)
    assert not _only_a_fenced_generate(entry, {"req_abc": SimpleNamespace(attempt=1,
                                                                          status="succeeded")})
    assert not _only_a_fenced_generate(entry, {"req_abc": SimpleNamespace(attempt=2,
                                                                          status="running")})
    assert not _only_a_fenced_generate(entry.replace("1 waiting", "2 waiting"), finished)
    assert not _only_a_fenced_generate(entry, {})
