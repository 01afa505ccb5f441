"""A returning instance takes work at once (workers/health/rebalance.py), on the real PostgreSQL
and Redis: when an instance comes back idle, it takes, by the what-if across the live pool, the
never-started requests waiting in the engines of its model's other instances that would end
sooner on it, routed to it directly (without execution-time models: the newest half go back to
routing); streamed and started ones stay; an instance of another model takes nothing, and one
that is busy again takes no more."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import update

from domain.models import InferenceRequest, RequestStatus
from domain.queues import request_ids_in_broker
from tests.engine_states import engine_state, waiting_request
from workers.health.rebalance import Rebalance
from workers.runtime import Runtime
from workers.sim.engine_state import RequestState
from workers.sim.exec_model import bundled_model, bundled_model_names

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


def _bundled(statuses: object) -> dict[str, object]:
    model = bundled_model(bundled_model_names()[0])
    return {s.instance_id: model for s in statuses}  # type: ignore[attr-defined]


def test_a_returned_instance_takes_its_share_by_the_what_if_routed_to_it_directly(
        rt: Runtime, routed_request: Callable[..., str],
        request_status: Callable[[str], str]) -> None:
    """Two survivors hold a backlog (12 and 6 waiting); the returned instance takes what would
    end sooner on it, more from the longer queue, each request routed to it at once (a new
    attempt there, assigned, its generate message on its queue), none back to routing, where
    round robin (the bias watch's fallback) sent half of them back."""
    rebalance = Rebalance(rt.outbox, rt.redis, fleet=rt.fleet, exec_models=_bundled)
    long_queue = [routed_request("gpu.0", 1, RUNNING) for _ in range(12)]
    short_queue = [routed_request("gpu.2", 1, RUNNING) for _ in range(6)]
    publish(rt, "gpu.0", "big", *(waiting_request(r, 200, 200) for r in long_queue))
    publish(rt, "gpu.2", "big", *(waiting_request(r, 200, 200) for r in short_queue))
    publish(rt, "gpu.1", "big")
    rt.fleet.mark_stopped("gpu.1")
    assert rebalance.run(rt.fleet.statuses()) == 0

    publish(rt, "gpu.1", "big")  # back, idle
    moved = rebalance.run(rt.fleet.statuses())

    taken = [r for r in long_queue + short_queue if request_status(r) == "routed"]
    assert moved == len(taken) > 0
    from_long = sum(r in long_queue for r in taken)
    assert from_long > len(taken) - from_long  # more from the longer queue
    assert set(taken) <= set(long_queue[-from_long:] + short_queue)  # the newest first
    with rt.db.session() as session:
        rows = [session.get(InferenceRequest, r) for r in taken]
    assert {(row.instance_id, row.attempt, row.policy) for row in rows if row} == {
        ("gpu.1", 2, "rebalance")}
    assert request_ids_in_broker(rt.redis, ["gpu.1"], fresh_s=30) == set(taken)
    assert request_ids_in_broker(rt.redis, ["route"], fresh_s=30) == set()
    (gpu1,) = [s for s in rt.fleet.statuses() if s.instance_id == "gpu.1"]
    assert {a.request_id for a in gpu1.assigned} == set(taken)
