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
from typing import Any

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



def _scaled_run(kinds: list[str], model_path: Path, requests: int, duration_s: float
                ) -> object:
    """A short run on an autoscaled fleet: 2 engines at start, 1 to 4."""
    harness = _harness()
    return harness.run(harness.RunConfig(
        requests=requests, faults_per_kind=1, kinds=kinds, seed=5, duration_s=duration_s,
        crash_after_commit=0.0, settle_timeout_s=120.0, recover_timeout_s=60.0,
        model_path=model_path, autoscale=True, instances=2, max_instances=4, start_s=4.0,
        scale_down_after_s=30.0), log=lambda message: None)


def _no_violations(result: Any) -> None:
    assert result.violations() == {}, json.dumps(
        {"violations": result.violations(), "settle": result.settle, "faults": result.faults,
         "scale events": result.scale_events, "workload": result.workload},
        indent=1, default=str)


def test_scale_events_under_faults_lose_nothing_and_do_nothing_twice(model_path: Path) -> None:
    """One of each scale fault but the supervisor's death: a drain under load, a start while
    Redis restarts empty, an engine SIGKILLed while it drains; the autoscaler scales
    meanwhile."""
    kinds = ["scale:down-under-load", "scale:up-during-redis-restart",
             "scale:engine-killed-draining"]
    result: Any = _scaled_run(kinds, model_path, requests=300, duration_s=60.0)

    notes = {row["kind"]: row["note"] for row in result.faults}
    told = json.dumps({"faults": result.faults, "scale events": result.scale_events}, indent=1)
    assert set(notes) == set(kinds), told
    assert notes["scale:down-under-load"].startswith("drained with"), told
    assert notes["scale:up-during-redis-restart"].startswith("Redis restarted"), told
    assert notes["scale:engine-killed-draining"].endswith("SIGKILLed while draining"), told
    assert result.scale_events["forced drains"] >= 2, told
    assert result.scale_events["forced starts"] >= 1, told
    assert sum(c.get("accepted", 0) for c in result.workload["by_kind"].values()) > 0
    _no_violations(result)


def test_the_supervisor_killed_mid_scale_loses_nothing(model_path: Path) -> None:
    """The supervisor dies mid-start or mid-drain; the stack is started again whole."""
    result: Any = _scaled_run(["scale:supervisor-killed"], model_path, requests=120,
                              duration_s=30.0)

    notes = {row["kind"]: row["note"] for row in result.faults}
    assert result.scale_events["stack restarts"] == 1, result.faults
    assert " of gpu." in notes["scale:supervisor-killed"], result.faults
    _no_violations(result)
