"""The engine host on the real PostgreSQL and Redis: an engine whose loop died stops its
instance's heartbeat, and the requests it held go back to routing instead of failing."""

from __future__ import annotations

from collections.abc import Callable

from domain.models import RequestStatus
from workers.health.sweep import Sweep
from workers.health.undelivered import WebhookPolicy
from workers.runtime import Runtime
from workers.serve.emulated_engine import EmulatedEngine, EmulatedEngineConfig
from workers.serve.engine import EngineListener
from workers.serve.host import EngineHost
from workers.sim import BatchStats, ExecModel


class FaultingGpu(ExecModel):
    """A GPU that faults on its first step (a device error): a fault this CPU cannot make."""

    def step_ms(self, stats: BatchStats) -> float:
        raise RuntimeError("device fault")


def test_an_engine_that_died_drops_its_heartbeat_and_its_request_is_rerouted(
    rt: Runtime, routed_request: Callable[..., str], request_status: Callable[[str], str]
) -> None:
    gpu = FaultingGpu("faulting", (), {"const": 1.0})

    def make_engine(listener: EngineListener) -> EmulatedEngine:
        return EmulatedEngine(EmulatedEngineConfig(exec_model=gpu, time_scale=0.01),
                              listener=listener)

    host = EngineHost("gpu.0", make_engine, rt)
    host.start()
    try:
        assert [s.instance_id for s in rt.fleet.routable()] == ["gpu.0"]
        request_id = routed_request("gpu.0", 1)

        host.run(request_id, 1)  # admitted, then the engine loop dies on its first step

        assert not host.engine.alive
        assert request_status(request_id) == RequestStatus.RUNNING  # not failed
        assert rt.fleet.routable() == [] and not rt.fleet.statuses()[0].alive
        host.publisher.publish_once()  # the periodic publish does not bring it back
        assert not rt.fleet.statuses()[0].alive
        report = Sweep(rt.outbox, rt.fleet, rt.redis, WebhookPolicy(
            backoff_s=1, max_attempts=1, grace_s=1), stranded_after_s=0, unacked_fresh_s=30,
            memory_s=10).run()
        assert report.rerouted == 1
        assert request_status(request_id) == RequestStatus.QUEUED
    finally:
        host.stop()
