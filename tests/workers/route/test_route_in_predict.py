"""The predict task routes what it has just predicted (Settings.route_in_predict): one
transaction writes the prediction and the decision, the outbox publishes to the chosen engine's
queue, and nothing goes through the route queue; without an instance, or with the setting off,
the route task takes over as before."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import update

from domain import request_store
from domain.models import InferenceRequest, RequestStatus
from domain.settings import Settings
from tests.engine_states import engine_state
from tests.workers.request_rows import new_request, stored_request
from tests.workers.route.pipeline_checks import events, in_queue, outbox_tasks
from workers.predict import stage as predict_stage
from workers.predict import tasks as predict_tasks
from workers.runtime import Runtime

QUEUES = ["gpu.0", "gpu.1", "route"]


@pytest.fixture
def worker(configure_worker: Callable[..., Runtime]) -> Callable[..., Runtime]:
    """The predict worker's runtime (baseline lengths, round robin), settings overridable."""

    def make(**overrides: Any) -> Runtime:
        return configure_worker(**{"length_predictor": "baseline",
                                   "routing_policy": "round_robin", **overrides})

    return make


@pytest.fixture
def queued(fresh_services: Settings) -> Iterator[Callable[[Runtime], str]]:
    def make(rt: Runtime) -> str:
        with rt.db.session() as session:
            return new_request(session, prompt="Hello there")

    yield make


def _row(rt: Runtime, request_id: str) -> InferenceRequest:
    return stored_request(rt.db, request_id)


def test_predict_routes_in_one_transaction_and_publishes_to_the_engine(
        worker: Callable[..., Runtime], queued: Callable[[Runtime], str]) -> None:
    rt = worker()
    rt.fleet.publish("gpu.0", engine_state())
    request_id = queued(rt)

    predict_tasks.annotate(request_id)

    row = _row(rt, request_id)
    assert (row.status, row.instance_id, row.attempt) == (RequestStatus.ROUTED, "gpu.0", 1)
    assert row.predicted_output_tokens is not None and row.predictor is not None
    assert row.predicted_at is not None and row.routed_at is not None
    assert row.routing is not None and row.routing["stages_ms"]["handoff"] == 0
    assert events(rt.db, request_id) == ["queued", "predicting", "routed"]
    assert in_queue(rt, "gpu.0") == {request_id}
    assert in_queue(rt, "route") == set()  # no hop through the router
    assert outbox_tasks(rt.db, rt.outbox) == []  # sent after the commit, then forgotten

    # A redelivered predict message changes nothing: the request is past the stage.
    predict_tasks.annotate(request_id)
    assert _row(rt, request_id).attempt == 1
    assert in_queue(rt, "gpu.0") == {request_id}


@pytest.mark.parametrize("inline", [True, False])
def test_without_an_instance_or_inline_routing_the_route_task_takes_over(
        worker: Callable[..., Runtime], queued: Callable[[Runtime], str], inline: bool) -> None:
    rt = worker(route_in_predict=inline)
    if not inline:
        rt.fleet.publish("gpu.0", engine_state())
    request_id = queued(rt)

    predict_tasks.annotate(request_id)

    row = _row(rt, request_id)
    assert row.status == RequestStatus.PREDICTING and row.predicted_output_tokens is not None
    assert row.instance_id is None and row.attempt == 0
    assert in_queue(rt, "route") == {request_id}
    assert in_queue(rt, "gpu.0") == set()


def test_a_request_cancelled_while_predicting_is_not_routed(
        worker: Callable[..., Runtime], queued: Callable[[Runtime], str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    rt = worker()
    rt.fleet.publish("gpu.0", engine_state())
    request_id = queued(rt)
    predictor = predict_stage.length_predictor(rt)
    predict = predictor.predict

    def cancelled_meanwhile(query: predict_stage.LengthQuery) -> predict_stage.LengthAnswer:
        with rt.db.session() as session:
            assert request_store.transition(session, request_id, RequestStatus.CANCELLED,
                                    allowed_from={RequestStatus.PREDICTING})
        return predict(query)

    monkeypatch.setattr(predictor, "predict", cancelled_meanwhile)
    predict_tasks.annotate(request_id)

    row = _row(rt, request_id)
    assert (row.status, row.instance_id, row.attempt) == (RequestStatus.CANCELLED, None, 0)
    assert in_queue(rt, "gpu.0") == set() and in_queue(rt, "route") == set()
    assert outbox_tasks(rt.db, rt.outbox) == []
    (status,) = rt.fleet.statuses()
    assert status.assigned == ()  # the decision's assignment was taken back


def _generate_attempts(rt: Runtime, queue: str) -> list[int]:
    """The `attempt` of each generate message waiting in `queue` (kombu's JSON envelope)."""
    import base64
    import json

    from domain.queues import queue_keys

    attempts = []
    for key in queue_keys(queue):
        for raw in rt.redis.lrange(key, 0, -1):
            (_request_id, attempt), _kwargs, _embed = json.loads(
                base64.b64decode(json.loads(raw)["body"]))
            attempts.append(attempt)
    return attempts


def test_a_redelivered_predict_of_a_request_already_predicting_predicts_and_routes_it(
        worker: Callable[..., Runtime], queued: Callable[[Runtime], str]) -> None:
    """The worker died after the predicting mark: its message comes again, and the request
    (read back without the mark's UPDATE) is predicted and routed once."""
    rt = worker()
    rt.fleet.publish("gpu.0", engine_state())
    request_id = queued(rt)
    with rt.db.session() as session:
        assert request_store.transition(session, request_id, RequestStatus.PREDICTING,
                                allowed_from={RequestStatus.QUEUED})

    predict_tasks.annotate(request_id)

    row = _row(rt, request_id)
    assert (row.status, row.instance_id, row.attempt) == (RequestStatus.ROUTED, "gpu.0", 1)
    assert row.predicted_output_tokens is not None
    assert events(rt.db, request_id) == ["queued", "predicting", "routed"]
    assert _generate_attempts(rt, "gpu.0") == [1]


def test_the_engine_is_sent_the_attempt_the_decision_wrote(
        worker: Callable[..., Runtime], queued: Callable[[Runtime], str]) -> None:
    """A request queued again after two attempts is routed as attempt 3, in its row and in
    the generate message (the decision's UPDATE returns it)."""
    rt = worker()
    rt.fleet.publish("gpu.0", engine_state())
    request_id = queued(rt)
    with rt.db.session() as session:
        session.execute(update(InferenceRequest).where(InferenceRequest.id == request_id)
                        .values(attempt=2))

    predict_tasks.annotate(request_id)

    assert _row(rt, request_id).attempt == 3
    assert _generate_attempts(rt, "gpu.0") == [3]


def test_a_request_past_predicting_is_left_alone(
        worker: Callable[..., Runtime], queued: Callable[[Runtime], str]) -> None:
    rt = worker()
    rt.fleet.publish("gpu.0", engine_state())
    request_id = queued(rt)
    with rt.db.session() as session:
        assert request_store.transition(session, request_id, RequestStatus.CANCELLED,
                                allowed_from={RequestStatus.QUEUED})

    assert predict_stage.start(rt.db, request_id) is None
    predict_tasks.annotate(request_id)

    assert _row(rt, request_id).status == RequestStatus.CANCELLED
    assert events(rt.db, request_id) == ["queued", "cancelled"]
    assert in_queue(rt, "gpu.0") == set()


@pytest.mark.parametrize("inline", [True, False])
def test_a_request_goes_only_to_an_instance_of_its_model_and_waits_for_one(
        worker: Callable[..., Runtime], fresh_services: Settings, inline: bool) -> None:
    from workers.route import tasks as route_tasks  # noqa: PLC0415

    rt = worker(route_in_predict=inline, routing_policy="least_requests", heartbeat_ttl_s=60.0)
    rt.fleet.publish("gpu.0", engine_state().published("gpu.0", "big", accepting=True))
    rt.fleet.publish("gpu.1", engine_state(num_running=9).published("gpu.1", "small",
                                                                     accepting=True))
    with rt.db.session() as session:
        small = new_request(session, prompt="Hello there", model="small")
        other = new_request(session, prompt="Hello there", model="gone")
    for request_id in (small, other):
        predict_tasks.annotate(request_id)
        if not inline:
            route_tasks.route(request_id)
    # The busier instance, but the only one of its model.
    assert (_row(rt, small).status, _row(rt, small).instance_id) == (RequestStatus.ROUTED,
                                                                     "gpu.1")
    # No instance of its model is up: it waits for one (routing is tried again), never
    # fails, and never goes to another model's instance.
    assert (_row(rt, other).status, _row(rt, other).instance_id) == (
        RequestStatus.PREDICTING, None)
    assert in_queue(rt, "route") >= {other}
    rt.fleet.publish("gpu.2", engine_state().published("gpu.2", "gone", accepting=True))
    route_tasks.route(other)
    assert (_row(rt, other).status, _row(rt, other).instance_id) == (RequestStatus.ROUTED,
                                                                     "gpu.2")
