"""Late binding in the route stage (Settings.routing_hold), on PostgreSQL and Redis: a request
no instance would start is held at the router, with its prediction written and nothing
published; the release task routes held requests oldest first once there is room; a hold past
its limit is routed anyway; a held request is not stranded, and one whose hold was lost is
found. (The engine's side, asking for a release: tests/workers/serve/test_publisher.py.)"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from domain import dispatch, request_store
from domain.models import InferenceRequest, OutboxEntry, RequestStatus
from domain.queues import request_ids_in_broker
from domain.settings import Settings
from tests.engine_states import engine_state, waiting_request
from tests.workers.request_rows import new_request, stored_request
from workers.health.sweep import Sweep
from workers.health.undelivered import WebhookPolicy
from workers.predict import tasks as predict_tasks
from workers.route import tasks as route_tasks
from workers.runtime import Runtime

#: One seat, taken: no instance would start another request.
FULL = engine_state(waiting_request("someone", 10, 10), num_waiting=1, max_num_seqs=1)


@pytest.fixture
def worker(configure_worker: Callable[..., Runtime],
           fresh_services: Settings) -> Callable[..., Runtime]:
    """A predict and route worker's runtime: baseline lengths, round robin, late binding.

    A published state lives a minute: the first task of a process loads the prompt tokenizer
    (several seconds), which must not outlive the 3 s default heartbeat the test published.
    """

    def make(**overrides: Any) -> Runtime:
        return configure_worker(**{"length_predictor": "baseline",
                                   "routing_policy": "round_robin", "routing_hold": True,
                                   "heartbeat_ttl_s": 60.0, **overrides})

    return make


def _submit(rt: Runtime) -> str:
    with rt.db.session() as session:
        return new_request(session, prompt="Hello there")


def _row(rt: Runtime, request_id: str) -> InferenceRequest:
    return stored_request(rt.db, request_id)


def _in_queue(rt: Runtime, queue: str) -> set[str]:
    return request_ids_in_broker(rt.redis, [queue], fresh_s=0)


def _held(rt: Runtime) -> list[str]:
    return [request_id for request_id, _ in rt.fleet.held(100)]


def test_a_request_no_instance_would_start_is_held_with_its_prediction(
        worker: Callable[..., Runtime]) -> None:
    rt = worker()
    rt.fleet.publish("gpu.0", FULL)
    request_id = _submit(rt)

    predict_tasks.annotate(request_id)

    row = _row(rt, request_id)
    assert row.status == RequestStatus.PREDICTING and row.predicted_output_tokens is not None
    assert row.instance_id is None and row.attempt == 0
    assert _held(rt) == [request_id]
    assert _in_queue(rt, "gpu.0") == set() and _in_queue(rt, "route") == set()
    assert rt.outbox.flush()
    with rt.db.session() as session:
        assert list(session.scalars(select(OutboxEntry.task))) == []
    (status,) = rt.fleet.statuses()
    assert status.assigned == ()  # nothing noted against the instance


def test_without_late_binding_the_same_request_is_routed_to_the_full_instance(
        worker: Callable[..., Runtime]) -> None:
    rt = worker(routing_hold=False)
    rt.fleet.publish("gpu.0", FULL)
    request_id = _submit(rt)
    predict_tasks.annotate(request_id)
    assert _row(rt, request_id).instance_id == "gpu.0" and _held(rt) == []


def test_room_releases_held_requests_oldest_first(worker: Callable[..., Runtime]) -> None:
    rt = worker(routing_hold_overtake_s=0.0)  # strict arrival order
    rt.fleet.publish("gpu.0", FULL)
    first = _submit(rt)
    predict_tasks.annotate(first)
    second = _submit(rt)
    rt.fleet.publish("gpu.0", engine_state())  # room now, but `second` may not pass `first`
    predict_tasks.annotate(second)
    assert _held(rt) == [first, second]

    route_tasks.release_held()

    rows = [_row(rt, first), _row(rt, second)]
    assert [r.status for r in rows] == [RequestStatus.ROUTED] * 2
    assert rows[0].routed_at <= rows[1].routed_at
    assert rows[0].routing is not None and rows[0].routing["held_s"] >= 0
    assert _held(rt) == [] and _in_queue(rt, "gpu.0") == {first, second}


def test_a_request_held_past_its_limit_is_routed_without_room(
        worker: Callable[..., Runtime]) -> None:
    rt = worker(routing_hold_max_s=0.05)
    rt.fleet.publish("gpu.0", FULL)
    request_id = _submit(rt)
    predict_tasks.annotate(request_id)
    assert _held(rt) == [request_id]
    time.sleep(0.1)

    route_tasks.release_held()

    assert _row(rt, request_id).instance_id == "gpu.0" and _held(rt) == []


def test_a_cancelled_held_request_leaves_the_hold_unrouted(
        worker: Callable[..., Runtime]) -> None:
    rt = worker()
    rt.fleet.publish("gpu.0", FULL)
    request_id = _submit(rt)
    predict_tasks.annotate(request_id)
    with rt.db.session() as session:
        assert request_store.transition(session, request_id, RequestStatus.CANCELLED,
                                allowed_from={RequestStatus.PREDICTING})
    rt.fleet.publish("gpu.0", engine_state())

    route_tasks.release_held()

    assert _row(rt, request_id).status == RequestStatus.CANCELLED and _held(rt) == []
    assert _in_queue(rt, "gpu.0") == set()


def _sweep(rt: Runtime, hold_limit_s: float = 60.0) -> Sweep:
    webhooks = WebhookPolicy(backoff_s=1.0, max_attempts=3, grace_s=0.0)
    return Sweep(rt.outbox, rt.fleet, rt.redis, webhooks, stranded_after_s=0,
                 unacked_fresh_s=30, memory_s=60, hold_limit_s=hold_limit_s)


def test_the_sweep_leaves_a_held_request_and_finds_one_whose_hold_was_lost(
        worker: Callable[..., Runtime]) -> None:
    rt = worker()
    rt.fleet.publish("gpu.0", FULL)
    request_id = _submit(rt)
    predict_tasks.annotate(request_id)

    assert _sweep(rt).run().suspected == 0  # held: it has a holder

    rt.redis.delete("blockq:routing:held")  # Redis restarted empty
    assert _sweep(rt).run().suspected == 1
    assert _sweep(rt).run().resent == 1
    assert _in_queue(rt, "route") == {request_id}
    route_tasks.route(request_id)  # the route task holds it again
    assert _held(rt) == [request_id] and _row(rt, request_id).instance_id is None


def test_with_late_binding_turned_off_the_sweep_sends_held_requests_on_to_be_routed(
        worker: Callable[..., Runtime]) -> None:
    rt = worker()
    rt.fleet.publish("gpu.0", FULL)
    request_id = _submit(rt)
    predict_tasks.annotate(request_id)
    assert _held(rt) == [request_id]

    off = worker(routing_hold=False)  # nothing will release it now
    assert _sweep(off, hold_limit_s=0).run().suspected == 1
    assert _sweep(off, hold_limit_s=0).run().resent == 1
    route_tasks.route(request_id)

    assert _row(off, request_id).instance_id == "gpu.0" and _held(off) == []


def test_the_release_message_goes_to_the_route_queue() -> None:
    message = dispatch.release_held()
    assert (message.task, message.queue) == (dispatch.TASK_RELEASE_HELD, dispatch.QUEUE_ROUTE)


def test_one_models_held_requests_never_hold_up_another_models(
        worker: Callable[..., Runtime]) -> None:
    rt = worker(routing_hold_overtake_s=0.0, heartbeat_ttl_s=60.0)  # strict arrival order
    rt.fleet.publish("gpu.0", FULL.published("gpu.0", "big", accepting=True))
    rt.fleet.publish("gpu.1", FULL.published("gpu.1", "small", accepting=True))

    def submit(model: str) -> str:
        with rt.db.session() as session:
            request_id = new_request(session, prompt="Hello there", model=model)
        predict_tasks.annotate(request_id)
        return request_id

    big, small = submit("big"), submit("small")
    assert _held(rt) == [big, small]  # no room on either model's instance
    rt.fleet.publish("gpu.1", engine_state().published("gpu.1", "small", accepting=True))
    # A new request of the small model waits behind the small one held before it only.
    later_small = submit("small")
    assert _held(rt) == [big, small, later_small]

    route_tasks.release_held()

    # The big model's oldest still finds no room: its model waits; the small model's go.
    assert _held(rt) == [big]
    assert [(_row(rt, r).status, _row(rt, r).instance_id) for r in (small, later_small)] == [
        (RequestStatus.ROUTED, "gpu.1")] * 2
    # With only the big model's request held past its turn, a small one is routed at once.
    assert submit("small") not in _held(rt)
