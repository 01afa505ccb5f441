"""A returning instance takes work at once (workers/health/rebalance.py), on the real PostgreSQL
and Redis: when an instance comes back idle, the newest half of the never-started requests
waiting in the engines of its model's other instances go back to routing (streamed and started
ones stay); an instance of another model takes nothing, and one that is busy again takes no
more."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import update

from app.models import InferenceRequest, RequestStatus
from app.queues import request_ids_in_broker
from tests.engine_states import engine_state, waiting_request
from workers.health.rebalance import Rebalance
from workers.runtime import Runtime
from workers.sim.engine_state import RequestState

RUNNING, QUEUED = RequestStatus.RUNNING, RequestStatus.QUEUED


def publish(rt: Runtime, instance_id: str, model: str, *requests: RequestState,
            **changes: object) -> None:
    state = engine_state(*requests, **{"num_waiting": sum(not r.is_running for r in requests),
                                       **changes})
    rt.fleet.publish(instance_id, state.published(instance_id, model, accepting=True))


def test_an_instance_back_from_a_crash_takes_waiting_work_of_its_model_at_once(
        rt: Runtime, routed_request: Callable[..., str],
        request_status: Callable[[str], str]) -> None:
    rebalance = Rebalance(rt.outbox, rt.redis)
    backlog = [routed_request("gpu.0", 2, RUNNING) for _ in range(6)]
    streamed, started = backlog[-1], backlog[-2]
    with rt.db.session() as session:
        session.execute(update(InferenceRequest).where(InferenceRequest.id == streamed)
                        .values(stream=True))
    waiting = [waiting_request(r, 10, 5) for r in backlog]
    waiting[-2] = RequestState(started, 10, 10, 1, 5, is_running=False)  # preempted, started
    publish(rt, "gpu.0", "big", *waiting)
    publish(rt, "gpu.1", "big")
    publish(rt, "gpu.2", "small")
    rt.fleet.mark_stopped("gpu.1")  # crashed
    rt.fleet.mark_stopped("gpu.2")
    assert rebalance.run(rt.fleet.statuses()) == 0  # nothing returned yet

    publish(rt, "gpu.1", "big")  # restarted, idle
    publish(rt, "gpu.2", "small")  # back too, but serves another model
    moved = rebalance.run(rt.fleet.statuses())

    # The newest half (2) of the five never started: the streamed one stays, as do the
    # started one and the older half.
    assert moved == 1
    assert [request_status(r) for r in backlog] == [RUNNING] * 3 + [QUEUED] + [RUNNING] * 2
    assert request_ids_in_broker(rt.redis, ["route"], fresh_s=30) == {backlog[3]}
    # Busy again, it takes no more; and nothing is moved twice.
    publish(rt, "gpu.1", "big", waiting_request(backlog[3], 10, 5))
    assert rebalance.run(rt.fleet.statuses()) == 0


def test_an_instance_that_never_left_takes_nothing(
        rt: Runtime, routed_request: Callable[..., str],
        request_status: Callable[[str], str]) -> None:
    rebalance = Rebalance(rt.outbox, rt.redis)
    backlog = [routed_request("gpu.0", 1, RUNNING) for _ in range(4)]
    publish(rt, "gpu.0", "big", *(waiting_request(r, 10, 5) for r in backlog))
    publish(rt, "gpu.1", "big")
    assert rebalance.run(rt.fleet.statuses()) == 0
    assert rebalance.run(rt.fleet.statuses()) == 0  # idle, but alive all along
    assert {request_status(r) for r in backlog} == {RUNNING}
