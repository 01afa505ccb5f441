"""The host-level faults, injected one after another during the run's traffic.

- `engine-host:kill`: every process of an engine host SIGKILLed at once; the host boots again
  after `down_s`.
- `control-host:kill`: the same for the control host that runs beat.
- `engine-host:partition`: an engine host's packets to and from the data host dropped
  (iptables in its namespace) for `partition_s`, then allowed again. The host is
  `partition_host` when set (the rig's vLLM host), else the busiest.
- `redis:restart`: the data host's Redis SIGKILLed and started again, empty.
- `host:clock-skew`: a control host's processes stopped (SIGTERM, as a reboot does) and started
  again with their wall clock `skew_s` ahead (hosts.skewed_env); it stays so to the end.

Each fault's `start` is when it began and `end` when it was healed (the host booted, the link
restored, Redis answering).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.chaos.faults import Fault
from benchmarks.chaos.processes import ProcessWatch
from benchmarks.chaos.services import OwnServices
from benchmarks.multihost import network
from benchmarks.multihost.hosts import HostStack, skewed_env

KINDS = ("engine-host:kill", "control-host:kill", "engine-host:partition", "redis:restart",
         "host:clock-skew")


@dataclass
class HostFaults:
    """What the injector acts on: the hosts' stacks and watches, the data host's services."""

    stacks: dict[str, HostStack]
    watches: dict[str, ProcessWatch]
    processes: dict[str, list[str]]  # host -> its process names
    services: OwnServices
    data_ip: str
    engine_hosts: list[str]
    control_host: str  # the one a control-host fault kills (beat's)
    down_s: float
    partition_s: float
    fleet_back: Callable[[Fault], bool]  # the fault's target works again
    recover_timeout_s: float
    #: Engine host -> requests routed to or running on its instance now.
    load: Callable[[], dict[str, int]]
    #: How long to wait for an engine host holding requests before an engine fault.
    busy_wait_s: float = 20.0
    #: The host a clock-skew fault restarts with its clock off, and by how much (seconds).
    skew_host: str = "ctl-b"
    skew_s: float = 30.0
    #: The engine host a partition cuts off; None: the busiest. The rig names its vLLM host:
    #: a real engine that goes on generating the requests re-routed off it meanwhile.
    partition_host: str | None = None

    def busiest_engine(self, rng: random.Random,
                       among: list[str] | None = None) -> tuple[str, int]:
        """The engine host (of `among`, default every one) holding the most requests, and
        how many, waiting up to busy_wait_s for one that holds any: a fault on an idle host
        tests nothing."""
        hosts = among or self.engine_hosts
        deadline = time.monotonic() + self.busy_wait_s
        while True:
            try:
                load = self.load()
            except Exception:  # noqa: BLE001 - the database may be busy: pick at random
                load = {}
            busiest = max(hosts, key=lambda h: (load.get(h, 0), rng.random()))
            if load.get(busiest, 0) or time.monotonic() > deadline:
                return busiest, load.get(busiest, 0)
            time.sleep(0.2)

    def engine_target(self, kind: str, rng: random.Random) -> tuple[str, int]:
        """The engine host a fault of `kind` hits, and the requests it holds."""
        if kind == "engine-host:partition" and self.partition_host is not None:
            return self.busiest_engine(rng, [self.partition_host])
        return self.busiest_engine(rng)

    def inject(self, kind: str, rng: random.Random) -> Fault:
        note = ""
        if kind.startswith("engine-host:"):
            target, holding = self.engine_target(kind, rng)
            note = f"{holding} requests on it"
        start = time.time()
        if kind == "engine-host:kill":
            self._kill_and_boot(target, kind)
        elif kind == "control-host:kill":
            target = self.control_host
            self._kill_and_boot(target, kind)
        elif kind == "engine-host:partition":
            network.partition(target, [self.data_ip], cut=True)
            time.sleep(self.partition_s)
            network.partition(target, [self.data_ip], cut=False)
        elif kind == "redis:restart":
            target = "data"
            self.services.kill_redis()
            time.sleep(rng.uniform(0.5, 2.0))
            self.services.start_redis()
        elif kind == "host:clock-skew":
            target = self.skew_host
            note = f"wall clock {self.skew_s:+g} s"
            self._restart_skewed(target, kind)
        else:
            raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(KINDS)}")
        return Fault(kind, target, start, time.time(), note=note)

    def _kill_and_boot(self, host: str, kind: str) -> None:
        stack, watch = self.stacks[host], self.watches[host]
        with watch.lock:
            watch.signalled.update({p.pid: kind for p in stack.processes.values()})
        stack.kill_host()
        time.sleep(self.down_s)
        stack.boot(self.processes[host])

    def _restart_skewed(self, host: str, kind: str) -> None:
        stack, watch = self.stacks[host], self.watches[host]
        with watch.lock:
            watch.signalled.update({p.pid: kind for p in stack.processes.values()})
        stack.stop()
        stack.env = skewed_env(stack.env, self.skew_s)
        stack.boot(self.processes[host])

    def wait_fleet_back(self, fault: Fault) -> float | None:
        """Seconds from the fault's end until its target works again; None past the recovery
        timeout."""
        deadline = time.monotonic() + self.recover_timeout_s
        while time.monotonic() < deadline:
            if self.fleet_back(fault):
                return round(time.time() - fault.end, 1)
            time.sleep(0.2)
        return None

    def run(self, kinds: list[str], first_at: float, rng: random.Random,
            faults: list[Fault], stop: threading.Event) -> None:
        """Each kind in turn at its planned moment: the first at `first_at` (monotonic), each
        next one `slot_s` of the previous after it (or as soon as the previous ended). Whether
        the target is back is watched in the background, so the schedule keeps to the
        traffic; returns when every fault ended and its watch is done."""
        at, watches = first_at, []
        for kind in kinds:
            while time.monotonic() < at:
                if stop.wait(0.1):
                    return
            fault = self.inject(kind, rng)
            faults.append(fault)
            watch = threading.Thread(target=self._watch_back, args=(fault,), daemon=True)
            watch.start()
            watches.append(watch)
            at += slot_s(kind, self.down_s, self.partition_s)
        for watch in watches:
            watch.join()

    def _watch_back(self, fault: Fault) -> None:
        fault.fleet_back_s = self.wait_fleet_back(fault)


def slot_s(kind: str, down_s: float, partition_s: float) -> float:
    """The traffic time a fault of `kind` gets: its own length, and 20 s to come back."""
    if kind.endswith(":kill"):
        return down_s + 20.0
    if kind.endswith(":partition"):
        return partition_s + 20.0
    return 20.0
