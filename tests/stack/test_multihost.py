"""A short run of the multi-host rig (scripts/multihost.py): blockq on hosts made of network
namespaces (a data host, two control hosts behind HAProxy, three engine hosts: emulated
instances, and on the third the real vLLM engine with the tiny model too), 30 requests while one
engine host is SIGKILLed wholesale and boots again, and then a control host restarts with its
wall clock 30 s ahead; then the chaos run's checks, and the vLLM instance served requests.

Needs root (network namespaces, veth pairs, a bridge) and haproxy: skipped, saying which, when
either is missing. The rig runs its own PostgreSQL and Redis in its data host's namespace.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.stack, pytest.mark.vllm]


def _rig() -> ModuleType:
    return importlib.import_module("benchmarks.multihost.run")


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "the rig creates network namespaces, veth pairs and a bridge: needs root"
    for tool in ("ip", "haproxy", "iptables", "unshare", "initdb", "redis-server"):
        if shutil.which(tool) is None:
            return f"the rig needs {tool} (Debian: iproute2, haproxy, iptables, util-linux, " \
                   "postgresql, redis-server)"
    return None


def test_an_engine_host_killed_and_a_host_30s_ahead_lose_nothing_across_hosts(
        model_path: Path) -> None:
    if (reason := _missing()) is not None:
        pytest.skip(reason)
    rig = _rig()
    kinds = ["engine-host:kill", "host:clock-skew"]
    config = rig.RigConfig(requests=30, kinds=kinds, seed=3, clients=8,
                           duration_s=30.0, down_s=5.0, settle_timeout_s=240.0,
                           model_path=model_path)

    result = rig.run(config, log=lambda message: None)

    assert [f["kind"] for f in result["faults"]] == kinds
    assert all(f["fleet_back_s"] is not None for f in result["faults"]), result["faults"]
    accepted = sum(c.get("accepted", 0) for c in result["workload"]["by_kind"].values())
    assert accepted > 0, result["workload"]
    headline = {k: result[k] for k in ("lost", "completed_twice", "missing_webhooks",
                                       "not_terminal")}
    assert headline == {"lost": 0, "completed_twice": 0, "missing_webhooks": 0,
                        "not_terminal": 0}, json.dumps(result, indent=1, default=str)
    assert result["violations"] == {}, json.dumps(result, indent=1, default=str)
    vllm = result["instances"][config.fleet.vllm_instance]
    assert vllm["engine"] == "vllm" and vllm["admitted"] > 0, result["instances"]
