"""The rig's hosts: their addresses, roles, and the processes each runs."""

from __future__ import annotations

from dataclasses import dataclass

from multihost_rig.network import HostAddress

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


@dataclass(frozen=True)
class BlockqHost:
    """A host that runs blockq processes: its address and process names."""

    address: HostAddress
    processes: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.address.name


def blockq_hosts() -> list[BlockqHost]:
    """Two control hosts (beat on the first) and one engine host per instance: engine host k
    runs instance gpu.<k>, the only consumer of its queue fleet-wide."""
    controls = [BlockqHost(CONTROL[0], (*CONTROL_PROCESSES, "beat")),
                BlockqHost(CONTROL[1], CONTROL_PROCESSES)]
    engines = [BlockqHost(address, (f"gpu.{k}",)) for k, address in enumerate(ENGINE)]
    return controls + engines


def instance_count() -> int:
    return len(ENGINE)
