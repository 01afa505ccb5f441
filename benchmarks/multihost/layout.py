"""The rig's hosts: their addresses, roles, the processes each runs, and the engine instances."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.multihost.network import HostAddress
from workers.sim.fleet_declaration import InstanceSpec

DATA = HostAddress("data", 10)
BALANCER = HostAddress("lb", 11)
CLIENT = HostAddress("client", 12)
CONTROL = (HostAddress("ctl-a", 21), HostAddress("ctl-b", 22))
ENGINE = (HostAddress("eng-1", 31), HostAddress("eng-2", 32), HostAddress("eng-3", 33))
ALL = (DATA, BALANCER, CLIENT, *CONTROL, *ENGINE)
#: The API's port on each control host, and the balancer's.
API_PORT = 8000
PG_PORT = 5432
REDIS_PORT = 6379
#: Every blockq process of a control host (beat only on the first).
CONTROL_PROCESSES = ("api", "predict", "predict_bulk", "route", "health", "batches",
                     "webhooks")
#: The model every instance serves (what the job's requests name).
MODEL = "tiny-llama"
#: The engine host that also runs the real vLLM instance (with `vllm`).
VLLM_HOST = ENGINE[-1].name


@dataclass(frozen=True)
class BlockqHost:
    """A host that runs blockq processes: its address and process names."""

    address: HostAddress
    processes: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.address.name


@dataclass(frozen=True)
class Fleet:
    """The engine instances: engine host k runs emulated instance gpu.<k>; with `vllm`, the
    last engine host also runs gpu.<n> (n engine hosts), a vLLM engine on the tiny model.
    Each instance is the only consumer of its queue fleet-wide."""

    vllm: bool = True

    def specs(self) -> tuple[InstanceSpec, ...]:
        """The `fleet` setting: instance k (queue gpu.<k>) is the k-th spec (one instance
        each: Settings expands `count` only when it parses the JSON)."""
        emulated = (InstanceSpec(model=MODEL, engine="emulated"),) * len(ENGINE)
        real = (InstanceSpec(model=MODEL, engine="vllm"),) if self.vllm else ()
        return (*emulated, *real)

    def by_host(self) -> dict[str, tuple[str, ...]]:
        """Engine host -> the ids of the instances it runs, in queue order."""
        hosts = {h.name: (f"gpu.{k}",) for k, h in enumerate(ENGINE)}
        if self.vllm:
            hosts[VLLM_HOST] += (self.vllm_instance,)
        return hosts

    @property
    def vllm_instance(self) -> str:
        return f"gpu.{len(ENGINE)}"

    def host_of(self) -> dict[str, str]:
        """Instance id -> its engine host."""
        return {i: host for host, ids in self.by_host().items() for i in ids}

    def engine_of(self, instance_id: str) -> str:
        return "vllm" if self.vllm and instance_id == self.vllm_instance else "emulated"

    def instance_count(self) -> int:
        return len(ENGINE) + int(self.vllm)


def blockq_hosts(fleet: Fleet) -> list[BlockqHost]:
    """Two control hosts (beat on the first) and the engine hosts, each running its
    instances' engine workers."""
    controls = [BlockqHost(CONTROL[0], (*CONTROL_PROCESSES, "beat")),
                BlockqHost(CONTROL[1], CONTROL_PROCESSES)]
    by_host = fleet.by_host()
    engines = [BlockqHost(address, by_host[address.name]) for address in ENGINE]
    return controls + engines
