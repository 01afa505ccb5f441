"""A short run of the chaos benchmark (scripts/chaos.py): the real stack on its own PostgreSQL and
Redis, a mixed job of 300 requests, one fault of each of several kinds, then the delivery
guarantees checked (docs/chaos.md).

The harness is the package `benchmarks.chaos` (scripts/chaos.py is its command line).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.slow

#: One of each kind of fault, a process of each role, and the servers; every kind of
#: scripts/chaos.py --list-kinds is in the full run.
KINDS = [
    "sigkill:gpu", "sigkill:route", "sigkill:api", "sigterm:webhooks", "sigterm:predict",
    "sigstop:gpu", "redis:restart-empty", "postgres:restart-immediate",
    "postgres:terminate-connections",
]


def _harness() -> ModuleType:
    """benchmarks.chaos.run (RunConfig, run)."""
    return importlib.import_module("benchmarks.chaos.run")


def test_a_short_chaos_run_loses_nothing_and_does_nothing_twice(model_path: Path) -> None:
    harness = _harness()
    config = harness.RunConfig(
        requests=300, faults_per_kind=1, kinds=KINDS, seed=12, duration_s=45.0,
        crash_after_commit=0.002, settle_timeout_s=90.0, recover_timeout_s=30.0,
        model_path=model_path,
    )

    result = harness.run(config, log=lambda message: None)

    injected = {row["kind"]: row["injected"] for row in result.fault_summary}
    assert all(injected.get(kind) == 1 for kind in KINDS), injected
    accepted = sum(c.get("accepted", 0) for c in result.workload["by_kind"].values())
    assert accepted > 0, result.workload
    assert result.violations() == {}, json.dumps(
        {"violations": result.violations(), "settle": result.settle,
         "workload": result.workload}, indent=1, default=str)


def test_scale_events_under_faults_lose_nothing_and_do_nothing_twice(model_path: Path) -> None:
    """On an autoscaled fleet (2 engines at start, 1 to 4), one of each scale fault: a drain
    under load, a start while Redis restarts empty, the supervisor killed mid-scale (the stack
    restarted whole), an engine SIGKILLed while it drains; the autoscaler scales meanwhile."""
    harness = _harness()
    scaling = importlib.import_module("benchmarks.chaos.scaling")
    config = harness.RunConfig(
        requests=360, faults_per_kind=1, kinds=scaling.SCALE_KINDS, seed=5, duration_s=80.0,
        crash_after_commit=0.0, settle_timeout_s=120.0, recover_timeout_s=60.0,
        model_path=model_path, autoscale=True, instances=2, max_instances=4, start_s=4.0,
        scale_down_after_s=30.0,
    )

    result = harness.run(config, log=lambda message: None)

    notes = {row["kind"]: row["note"] for row in result.faults}
    told = json.dumps({"faults": result.faults, "scale events": result.scale_events}, indent=1)
    assert set(notes) == set(scaling.SCALE_KINDS), told
    assert notes["scale:down-under-load"].startswith("drained with"), told
    assert notes["scale:up-during-redis-restart"].startswith("Redis restarted"), told
    assert notes["scale:supervisor-killed"].startswith("killed mid-"), told
    assert " of gpu." in notes["scale:supervisor-killed"], told  # a start or drain under way
    assert notes["scale:engine-killed-draining"].endswith("SIGKILLed while draining"), told
    assert result.scale_events["stack restarts"] == 1, told
    assert result.scale_events["forced drains"] >= 2, told
    assert result.scale_events["forced starts"] >= 1, told
    accepted = sum(c.get("accepted", 0) for c in result.workload["by_kind"].values())
    assert accepted > 0, result.workload
    assert result.violations() == {}, json.dumps(
        {"violations": result.violations(), "settle": result.settle, "faults": result.faults,
         "workload": result.workload}, indent=1, default=str)
