"""Ghosts of an earlier fleet (real PostgreSQL and Redis, no engine: instances are published
states): an instance dead for instance_expiry_s leaves /v1/instances and is forgotten by the
sweep; a model then served by no registered instance, and not declared by the fleet setting, is
a 404 like an unknown model; requests accepted for it fail with `model_not_served`."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from flask.testing import FlaskClient

from domain import served_models
from domain.live_fleet import Fleet
from domain.settings import Settings
from domain.streams import read_stream
from tests.app.flask_client import api_client, error_body, services_of
from tests.engine_states import engine_state
from workers.health.ghosts import NOT_SERVED_CODE, fail_unserved, forget_ghosts
from workers.sim.engine_state import Declared

pytestmark = pytest.mark.services

BIG, OLD = "big-model", "old-model"


def publish(fleet: Fleet, instance_id: str, model: str) -> None:
    fleet.publish(instance_id, engine_state().published(
        instance_id, Declared(model, f"/models/{model}", "cpu"), accepting=True))


def eventually(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def fleet_of(settings: Settings) -> FlaskClient:
    """The fleet declares BIG (gpu.0, alive); gpu.1 of an earlier fleet served OLD and died."""
    client = api_client(settings.model_copy(update={"model_name": BIG}))
    svc = services_of(client)
    publish(svc.fleet, "gpu.0", BIG)
    publish(svc.fleet, "gpu.1", OLD)
    svc.fleet.mark_stopped("gpu.1")
    with svc.db.session() as session:
        served_models.declare(session, BIG, "/models/big")
        served_models.declare(session, OLD, "/models/old")
    return client


def listed(client: FlaskClient) -> set[str]:
    return {i["id"] for i in client.get("/v1/instances").get_json()["data"]}


def test_a_dead_instance_leaves_the_listing_after_the_expiry(fresh_services: Settings) -> None:
    client = fleet_of(fresh_services.model_copy(update={"instance_expiry_s": 0.05}))
    assert eventually(lambda: listed(client) == {"gpu.0"}), listed(client)
    kept = fleet_of(fresh_services)  # the default expiry (minutes): still listed, as dead
    assert {i["id"]: i["alive"] for i in kept.get("/v1/instances").get_json()["data"]} == {
        "gpu.0": True, "gpu.1": False}


@pytest.mark.parametrize("stream", [False, True])
def test_a_model_only_a_forgotten_instance_served_is_a_404(fresh_services: Settings,
                                                           stream: bool) -> None:
    client = fleet_of(fresh_services)
    fleet = services_of(client).fleet
    body = {"model": OLD, "prompt": "Hi", "max_tokens": 2, "stream": stream}
    assert error_body(client.post("/v1/completions", json=body), 503)["code"] == \
        "model_unavailable"  # dead, not yet forgotten: it may come back

    assert forget_ghosts(fleet, fleet.statuses(), expiry_s=0.0) == ["gpu.1"]

    error = error_body(client.post("/v1/completions", json=body), 404)
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    native = client.post("/v1/requests", json={"model": OLD, "prompt": "Hi"})
    assert error_body(native, 404)["code"] == "model_not_found"
    assert client.post("/v1/requests", json={"model": BIG, "prompt": "Hi"}).status_code == 202
    assert [s.instance_id for s in fleet.statuses()] == ["gpu.0"]
    publish(fleet, "gpu.1", OLD)  # it comes back: registered and served again
    assert client.post("/v1/requests", json={"model": OLD, "prompt": "Hi"}).status_code == 202


def test_requests_accepted_for_a_model_no_one_serves_fail_with_the_reason(
        fresh_services: Settings) -> None:
    client = fleet_of(fresh_services)
    svc = services_of(client)
    old = client.post("/v1/requests", json={"model": OLD, "prompt": "Hi"}).get_json()["id"]
    big = client.post("/v1/requests", json={"model": BIG, "prompt": "Hi"}).get_json()["id"]
    # Its instance is dead but not forgotten: the request waits for it.
    assert fail_unserved(svc.outbox, svc.fleet, svc.settings, timeout_s=0.0) == []

    forget_ghosts(svc.fleet, svc.fleet.statuses(), expiry_s=0.0)
    assert fail_unserved(svc.outbox, svc.fleet, svc.settings, timeout_s=3600.0) == []
    assert fail_unserved(svc.outbox, svc.fleet, svc.settings, timeout_s=0.0) == [old]

    shown = client.get(f"/v1/requests/{old}").get_json()
    assert shown["status"] == "failed" and shown["error"]["code"] == NOT_SERVED_CODE
    assert OLD in shown["error"]["message"]
    assert client.get(f"/v1/requests/{big}").get_json()["status"] in ("queued", "predicting")
    # A held completion waiting on it reads the end at once (its stream).
    event = next(read_stream(svc.fleet.redis, old, block_ms=100))
    assert event is not None and event.kind == "error" and OLD in event.value
