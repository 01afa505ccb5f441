"""The multi-host rig's pure parts (`benchmarks.multihost`): the hosts and their processes, the
fleet (emulated instances and one vLLM), the faults' targets, the command that runs a process
as a host, HAProxy's configuration, the summary's counts. The rig
itself runs in tests/stack/test_multihost.py (root only)."""

from __future__ import annotations

import importlib
import json
import os
import random
import subprocess
import sys
import time
from types import ModuleType

import pytest

from domain.settings import Settings


def _rig(module: str) -> ModuleType:
    return importlib.import_module(f"benchmarks.multihost.{module}")


@pytest.mark.parametrize("vllm", [True, False])
def test_every_host_has_its_own_address_and_engine_queues_are_unique(vllm: bool) -> None:
    layout = _rig("layout")
    addresses = [h.ip for h in layout.ALL]
    assert len(set(addresses)) == len(addresses)
    fleet = layout.Fleet(vllm=vllm)
    hosts = layout.blockq_hosts(fleet)
    beat = [h.name for h in hosts if "beat" in h.processes]
    assert beat == ["ctl-a"]  # exactly one beat in the fleet
    engines = [p for h in hosts for p in h.processes if p.startswith("gpu.")]
    assert engines == [f"gpu.{k}" for k in range(fleet.instance_count())]
    for host in hosts[:2]:  # both control hosts run every control process
        assert set(layout.CONTROL_PROCESSES) <= set(host.processes)


def test_the_fleet_setting_runs_a_vllm_instance_beside_eng_3s_emulated_one() -> None:
    layout = _rig("layout")
    fleet = layout.Fleet(vllm=True)
    settings = Settings(fleet=fleet.specs())
    kinds = {i: settings.for_instance(i).engine_kind for i in settings.instance_ids}
    assert kinds == {"gpu.0": "emulated", "gpu.1": "emulated", "gpu.2": "emulated",
                     "gpu.3": "vllm"}
    assert {i: fleet.engine_of(i) for i in kinds} == kinds
    assert fleet.by_host()[layout.VLLM_HOST] == ("gpu.2", "gpu.3")
    assert {settings.for_instance(i).model_name for i in kinds} == {layout.MODEL}
    # Every host gets the fleet through the environment, as a real host's settings file.
    env = Settings(fleet=fleet.specs()).as_env()
    assert Settings(fleet=env["BLOCKQ_FLEET"]).instance_ids == settings.instance_ids
    assert Settings(fleet=layout.Fleet(vllm=False).specs()).instance_ids == [
        "gpu.0", "gpu.1", "gpu.2"]


def test_the_partition_cuts_off_the_named_host_and_a_kill_the_busiest() -> None:
    faults = _rig("faults")
    load = {"eng-1": 5, "eng-2": 0, "eng-3": 2}
    injector = faults.HostFaults(
        stacks={}, watches={}, processes={}, services=None, data_ip="10.213.0.10",
        engine_hosts=["eng-1", "eng-2", "eng-3"], control_host="ctl-a", down_s=0,
        partition_s=0, fleet_back=lambda fault: True, recover_timeout_s=0,
        load=lambda: load, busy_wait_s=0, partition_host="eng-3")
    rng = random.Random(1)
    assert injector.engine_target("engine-host:partition", rng) == ("eng-3", 2)
    assert injector.engine_target("engine-host:kill", rng) == ("eng-1", 5)
    injector.partition_host = None
    assert injector.engine_target("engine-host:partition", rng) == ("eng-1", 5)


def test_a_host_command_runs_in_its_namespace_under_its_hostname() -> None:
    hosts = _rig("hosts")
    command = hosts.host_command("eng-2", ["celery", "-A", "workers", "worker", "-n", "x@%h"])
    assert command[:4] == ["ip", "netns", "exec", "bqmh-eng-2"]
    assert command[4:6] == ["unshare", "--uts"]
    # sh -c '<script>' <hostname> <command...>: $0 is the hostname, "$@" the command.
    script_at = command.index("-c") + 1
    assert command[script_at + 1] == "eng-2"
    assert command[script_at + 2:] == ["celery", "-A", "workers", "worker", "-n", "x@%h"]


def test_haproxy_checks_readiness_and_outlasts_the_longest_answer() -> None:
    balancer = _rig("balancer")
    config = balancer.haproxy_config("10.213.0.11:8000", [("ctl-a", "10.213.0.21:8000"),
                                                          ("ctl-b", "10.213.0.22:8000")],
                                     timeout_s=150)
    assert "bind 10.213.0.11:8000" in config
    assert "option httpchk GET /readyz" in config
    assert "timeout server 150s" in config and "timeout client 150s" in config
    assert "server ctl-a 10.213.0.21:8000 check" in config
    assert "server ctl-b 10.213.0.22:8000 check" in config
    assert "option redispatch" in config
    assert "http-request deny if { path_beg /metrics }" in config


def test_the_summary_adds_up_the_chaos_checks() -> None:
    summary = _rig("summary").summary
    findings = {"accepted but no row": {"count": 1}, "completed twice": {"count": 2},
                "webhooks missing": {"count": 3}, "batch webhooks missing": {"count": 4},
                "lost (not terminal)": {"count": 5}, "answer mismatches": {"count": 0}}
    result = summary(requests=300, broker="redis", findings=findings,
                     settle={"seconds": 12.0, "settled": False}, fault_summary=[], faults=[],
                     batches_not_terminal=1, extra={})
    assert (result["requests"], result["lost"], result["completed_twice"],
            result["missing_webhooks"], result["not_terminal"]) == (300, 1, 2, 7, 6)
    assert "answer mismatches" not in result["violations"]


@pytest.mark.parametrize(("kinds", "at_least"), [(["redis:restart"], 45.0),
                                                   (["engine-host:partition"], 60.0)])
def test_traffic_lasts_as_long_as_the_faults(kinds: list[str], at_least: float) -> None:
    config = _rig("run").RigConfig(kinds=kinds, partition_s=60.0)
    assert config.traffic_s() >= at_least


_CLOCKS = """
import datetime, json, threading, time
start = time.monotonic()
time.sleep(0.05)
threading.Event().wait(0.05)
print(json.dumps({"time": time.time(), "time_ns": time.time_ns() / 1e9,
                  "now": datetime.datetime.now(datetime.UTC).timestamp(),
                  "utcnow": datetime.datetime.utcnow().replace(tzinfo=datetime.UTC).timestamp(),
                  "slept": time.monotonic() - start,
                  "real_is_datetime": isinstance(datetime.datetime.fromtimestamp(0),
                                                 datetime.datetime)}))
"""


@pytest.mark.parametrize("offset_s", [30.0, -30.0])
def test_a_skewed_host_reads_its_wall_clock_off_and_its_monotonic_clock_as_is(
        offset_s: float) -> None:
    hosts = _rig("hosts")
    env = hosts.skewed_env({"PATH": os.environ.get("PATH", "")}, offset_s)
    before = time.time()
    out = subprocess.run([sys.executable, "-c", _CLOCKS], env=env, capture_output=True,
                         text=True, check=True, timeout=60)
    after = time.time()
    clocks = json.loads(out.stdout)
    for name in ("time", "time_ns", "now", "utcnow"):
        assert before + offset_s - 1 <= clocks[name] <= after + offset_s + 1, (name, clocks)
    assert 0.1 <= clocks["slept"] < 5.0  # sleeps and waits by the monotonic clock, unchanged
    assert clocks["real_is_datetime"], "datetimes made by C code fail isinstance"


class _Queues:
    """A broker whose webhooks queue holds one unacknowledged retry for `busy` samples."""

    def __init__(self, busy: int) -> None:
        self.busy, self.calls = busy, 0

    def queues(self) -> dict[str, tuple[int, int]]:
        self.calls += 1
        held = 1 if self.calls <= self.busy else 0
        return {"webhooks": (0, held), "celery_delayed_0": (3, 0)}


def test_the_leftover_check_waits_out_a_retry_held_for_a_skewed_eta() -> None:
    """A countdown from a host whose clock runs ahead is held unacknowledged elsewhere until
    that ETA: late by the skew, not left over. The wait ends once the queues are empty (the
    delayed-delivery ones aside), and gives up at its bound."""
    wait_for_idle_queues = _rig("rabbitmq").wait_for_idle_queues
    draining = _Queues(busy=3)
    wait_for_idle_queues(draining, within_s=5.0, interval_s=0.01)
    assert draining.calls == 4
    stuck = _Queues(busy=10**6)
    started = time.monotonic()
    wait_for_idle_queues(stuck, within_s=0.1, interval_s=0.01)
    assert 0.1 <= time.monotonic() - started < 1.0
