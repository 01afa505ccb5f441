"""The API routes the held completions it accepts (Settings.route_in_api): it predicts and routes
each in its own process, and the transaction recording the decision retires the predict message
it staged, deferred, with the request. When it cannot (no instance, an error, a crash), the
predict task takes the request over from that message, and one decision is recorded whatever
the order. Real PostgreSQL and Redis."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from domain import dispatch, request_store
from domain.dispatch import Message
from domain.models import InferenceRequest, RequestStatus
from domain.queues import request_ids_in_broker
from domain.settings import Settings
from tests.app.flask_client import api_client, error_body, services_of
from tests.engine_states import engine_state
from tests.workers.request_rows import REQUEST_FIELDS, stored_request
from tests.workers.route.pipeline_checks import events, in_queue, outbox_tasks
from workers.predict import inline
from workers.predict import stage as predict_stage
from workers.predict import tasks as predict_tasks
from workers.predict.inline import InlineRouter
from workers.predict.length_model import bootstrap_artifact
from workers.runtime import Runtime

IN_API = {"route_in_api": True, "length_predictor": "baseline", "routing_policy": "round_robin"}


@pytest.fixture
def worker(configure_worker: Callable[..., Runtime]) -> Callable[..., Runtime]:
    def make(**overrides: Any) -> Runtime:
        return configure_worker(**{**IN_API, **overrides})

    return make


def _stored(rt: Runtime, prompt: str = "Hello there") -> tuple[InferenceRequest,
                                                                tuple[int, Message]]:
    """A request stored as the API stores it under route_in_api: queued, its predict message
    staged and deferred."""
    with rt.outbox.transaction() as tx:
        (request,) = request_store.create_requests(tx.session, [REQUEST_FIELDS | {
            "prompt": prompt, "model": rt.settings.model_name}])
        tx.post(dispatch.predict(request.id, priority=0), defer=True)
    (entry,) = tx.deferred
    return request, entry


def _router(rt: Runtime) -> InlineRouter:
    return InlineRouter(rt.settings, db=rt.db, redis=rt.redis, fleet=rt.fleet, celery=rt.celery,
                        outbox=rt.outbox)


def test_a_held_completion_is_routed_by_the_api_without_the_predict_queue(
        fresh_services: Settings) -> None:
    settings = fresh_services.model_copy(update={**IN_API, "sync_timeout_s": 0.3})
    client = api_client(settings)
    svc = services_of(client)
    svc.fleet.publish("gpu.0", engine_state(model=settings.model_name))

    # No engine runs here: the held call ends at sync_timeout_s, and the request goes on.
    response = client.post("/v1/completions", json={
        "model": settings.model_name, "prompt": "Hello there", "max_tokens": 4})
    assert error_body(response, 504)["code"] == "timeout"

    with svc.db.session() as session:
        (row,) = session.scalars(select(InferenceRequest)).all()
    assert (row.status, row.instance_id, row.attempt) == (RequestStatus.ROUTED, "gpu.0", 1)
    assert row.predicted_output_tokens is not None and row.routing["routed_in"] == "api"
    assert events(svc.db, row.id) == ["queued", "routed"]
    assert request_ids_in_broker(svc.fleet.redis, ["gpu.0"], fresh_s=0) == {row.id}
    assert request_ids_in_broker(svc.fleet.redis, ["predict"], fresh_s=0) == set()
    assert outbox_tasks(svc.db, svc.outbox) == []  # predict's entry retired


def test_the_api_retires_the_predict_message_in_the_decisions_transaction(
        worker: Callable[..., Runtime]) -> None:
    rt = worker()
    rt.fleet.publish("gpu.0", engine_state(model=rt.settings.model_name))
    request, entry = _stored(rt)
    assert outbox_tasks(rt.db, rt.outbox) == [dispatch.TASK_PREDICT]  # staged, not sent

    assert _router(rt).route(request, entry)

    row = stored_request(rt.db, request.id)
    assert (row.status, row.instance_id, row.attempt) == (RequestStatus.ROUTED, "gpu.0", 1)
    assert events(rt.db, request.id) == ["queued", "routed"]
    assert outbox_tasks(rt.db, rt.outbox) == []
    assert in_queue(rt, "gpu.0") == {request.id} and in_queue(rt, "predict") == set()


@pytest.mark.parametrize("failure", ["no instance", "error"])
def test_what_the_api_cannot_route_the_predict_task_takes_over(
        worker: Callable[..., Runtime], monkeypatch: pytest.MonkeyPatch, failure: str) -> None:
    rt = worker()
    if failure == "error":
        rt.fleet.publish("gpu.0", engine_state(model=rt.settings.model_name))
    router = _router(rt)
    if failure == "error":
        def broken(query: predict_stage.LengthQuery) -> predict_stage.LengthAnswer:
            raise RuntimeError("the length model broke")

        monkeypatch.setattr(predict_stage.length_predictor(router.rt), "predict", broken)
    request, entry = _stored(rt)

    assert not router.route(request, entry)

    assert stored_request(rt.db, request.id).status == RequestStatus.QUEUED
    assert in_queue(rt, "predict") == {request.id}  # sent at once
    assert outbox_tasks(rt.db, rt.outbox) == []
    # The predict task routes it as any other (here: once an instance is up).
    monkeypatch.undo()
    rt.fleet.publish("gpu.0", engine_state(model=rt.settings.model_name))
    predict_tasks.annotate(request.id)
    row = stored_request(rt.db, request.id)
    assert (row.status, row.instance_id, row.attempt) == (RequestStatus.ROUTED, "gpu.0", 1)


def test_a_saturated_api_leaves_a_late_request_to_the_predict_task(
        worker: Callable[..., Runtime]) -> None:
    """An API process that reaches a request MAX_DELAY_S after its commit (its event loop
    saturated) sends it to the predict queue rather than race the outbox relay."""
    rt = worker()
    rt.fleet.publish("gpu.0", engine_state(model=rt.settings.model_name))
    request, entry = _stored(rt)
    request.created_at -= timedelta(seconds=inline.MAX_DELAY_S)

    assert not _router(rt).route(request, entry)

    assert stored_request(rt.db, request.id).status == RequestStatus.QUEUED
    assert in_queue(rt, "predict") == {request.id} and in_queue(rt, "gpu.0") == set()


def test_after_an_api_crash_the_relay_sends_the_deferred_predict_message(
        worker: Callable[..., Runtime]) -> None:
    rt = worker()
    request, _ = _stored(rt)  # the API died before routing it

    assert rt.outbox.relay(older_than_s=0) == 1

    assert in_queue(rt, "predict") == {request.id}
    assert outbox_tasks(rt.db, rt.outbox) == []


def test_one_decision_when_the_relayed_predict_task_routes_first(
        worker: Callable[..., Runtime]) -> None:
    """A slow API (its deferred entry relayed meanwhile) and the predict task: whichever records
    its decision first wins; the other's conditional write changes nothing."""
    rt = worker()
    rt.fleet.publish("gpu.0", engine_state(model=rt.settings.model_name))
    request, entry = _stored(rt)
    rt.outbox.relay(older_than_s=0)
    predict_tasks.annotate(request.id)  # the relayed message, first

    _router(rt).route(request, entry)

    row = stored_request(rt.db, request.id)
    assert (row.status, row.attempt) == (RequestStatus.ROUTED, 1)
    assert "routed_in" not in row.routing  # the predict task's decision stands
    assert events(rt.db, request.id) == ["queued", "predicting", "routed"]
    assert in_queue(rt, "gpu.0") == {request.id}
    assert outbox_tasks(rt.db, rt.outbox) == []


def test_late_binding_keeps_routing_with_the_route_worker() -> None:
    settings = Settings(route_in_api=True, routing_hold=True)
    assert not settings.routes_in_api
    assert Settings(route_in_api=True).routes_in_api


def test_the_api_loads_its_length_model_as_it_starts(fresh_services: Settings) -> None:
    """Not on the first completion each API process serves."""
    settings = fresh_services.model_copy(update={
        **IN_API, "length_predictor": "learned",
        "length_fast_model_path": bootstrap_artifact("static")})
    client = api_client(settings)

    router = client.application.extensions["blockq.inline_router"]
    assert "packaged" in predict_stage.learned_lengths(router.rt, predict_stage.HEAD_FAST).__dict__
