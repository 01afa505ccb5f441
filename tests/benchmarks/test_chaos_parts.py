"""The chaos harness's pure parts (`benchmarks.chaos`): the fault kinds of a stack, the
schedule, the crash-after-commit faults read back from the logs, the summary per fault kind.
The whole run is tests/stack/test_chaos.py."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

from app.settings import Settings
from benchmarks.chaos.faults import (
    CRASH_AFTER_COMMIT_LINE,
    Fault,
    crash_faults,
    fault_kinds,
    schedule_faults,
)
from benchmarks.chaos.summaries import summarize_faults


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
