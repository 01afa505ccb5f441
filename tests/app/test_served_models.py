"""Several models on one fleet, at the API (real PostgreSQL and Redis, no engine: instances are
published states): /v1/models lists the models a live instance serves; a model never served is a
404 `model_not_found`; a served model whose instances are all down gets a held completion a 503
with Retry-After, while an asynchronous request for it is accepted and waits; a batch names one
served model, else a 400 naming the line."""

from __future__ import annotations

import json

import pytest
from flask.testing import FlaskClient

from domain import served_models
from domain.db import Database
from domain.live_fleet import Fleet
from domain.models import ServedModel
from domain.settings import Settings
from tests.app.flask_client import api_client, error_body, services_of, upload
from tests.engine_states import engine_state
from workers.sim.engine_state import Declared

pytestmark = pytest.mark.services

BIG, SMALL = "big-model", "small-model"


@pytest.fixture
def client(fresh_services: Settings) -> FlaskClient:
    """An API whose fleet is declared in Redis only: gpu.0 serves BIG (alive), gpu.1 SMALL
    (its heartbeat gone); both models are recorded as served."""
    client = api_client(fresh_services.model_copy(update={"model_name": BIG}))
    svc = services_of(client)
    publish(svc.fleet, "gpu.0", BIG)
    publish(svc.fleet, "gpu.1", SMALL)
    svc.fleet.mark_stopped("gpu.1")
    from domain import served_models  # noqa: PLC0415 - what engine workers write at start

    with svc.db.session() as session:
        served_models.declare(session, BIG, "/models/big")
        served_models.declare(session, SMALL, "/models/small")
    return client


def publish(fleet: Fleet, instance_id: str, model: str) -> None:
    fleet.publish(instance_id, engine_state().published(
        instance_id, Declared(model, f"/models/{model}", "cpu"), accepting=True))


def completion(client: FlaskClient, model: str, **extra: object):  # type: ignore[no-untyped-def]
    return client.post("/v1/completions", json={"model": model, "prompt": "Hello",
                                                "max_tokens": 2, **extra})


def test_models_lists_each_model_a_live_instance_serves(client: FlaskClient) -> None:
    listed = client.get("/v1/models").get_json()
    assert listed["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in listed["data"]] == [
        (BIG, "model", "blockq")]
    assert client.get(f"/v1/models/{BIG}").get_json()["id"] == BIG
    assert error_body(client.get(f"/v1/models/{SMALL}"), 404)["code"] == "model_not_found"
    publish(services_of(client).fleet, "gpu.1", SMALL)  # its instance returns
    assert [m["id"] for m in client.get("/v1/models").get_json()["data"]] == [BIG, SMALL]


@pytest.mark.parametrize("stream", [False, True])
def test_a_model_never_served_is_a_404_for_every_kind_of_call(client: FlaskClient,
                                                              stream: bool) -> None:
    error = error_body(completion(client, "gpt-9", stream=stream), 404)
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert "gpt-9" in error["message"]
    native = client.post("/v1/requests", json={"model": "gpt-9", "prompt": "Hello"})
    assert error_body(native, 404)["code"] == "model_not_found"


@pytest.mark.parametrize("stream", [False, True])
def test_a_held_call_for_a_model_whose_instances_are_down_gets_503_with_retry_after(
        client: FlaskClient, stream: bool) -> None:
    answer = completion(client, SMALL, stream=stream)
    error = error_body(answer, 503)
    assert error["code"] == "model_unavailable" and SMALL in error["message"]
    assert int(answer.headers["Retry-After"]) >= 1


def test_an_async_request_for_a_model_whose_instances_are_down_is_accepted_with_its_model(
        client: FlaskClient) -> None:
    accepted = client.post("/v1/requests", json={"model": SMALL, "prompt": "Hello"})
    assert accepted.status_code == 202, accepted.get_data(as_text=True)
    request_id = accepted.get_json()["id"]
    shown = client.get(f"/v1/requests/{request_id}").get_json()
    assert shown["model"] == SMALL and shown["status"] in ("queued", "predicting")
    # A request that names no model runs on the default one (the first of the fleet).
    default = client.post("/v1/requests", json={"prompt": "Hello"}).get_json()["id"]
    assert client.get(f"/v1/requests/{default}").get_json()["model"] == BIG


def test_a_model_served_before_but_unseen_since_redis_restarted_is_waited_for(
        client: FlaskClient) -> None:
    services_of(client).fleet.redis.flushdb()
    assert client.post("/v1/requests", json={"model": SMALL, "prompt": "Hi"}).status_code == 202
    assert error_body(completion(client, SMALL), 503)["code"] == "model_unavailable"
    assert error_body(completion(client, "gpt-9"), 404)["code"] == "model_not_found"


def batch_file(*models: str | None) -> bytes:
    lines = [{"custom_id": str(i), "method": "POST", "url": "/v1/completions",
              "body": {"prompt": "Hi", "max_tokens": 2, **({"model": m} if m else {})}}
             for i, m in enumerate(models)]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def create_batch(client: FlaskClient, content: bytes):  # type: ignore[no-untyped-def]
    file_id = upload(client, content).get_json()["id"]
    return client.post("/v1/batches", json={"input_file_id": file_id,
                                            "endpoint": "/v1/completions",
                                            "completion_window": "24h"})


def test_a_batch_is_checked_at_creation_for_one_served_model(client: FlaskClient) -> None:
    created = create_batch(client, batch_file(None, SMALL, SMALL))
    assert created.status_code == 200, created.get_data(as_text=True)
    assert created.get_json()["model"] == SMALL  # its instances are down: it waits for them
    unknown = error_body(create_batch(client, batch_file(None, "gpt-9", BIG)), 400)
    assert unknown["code"] == "model_not_found" and "Line 2" in unknown["message"]
    mixed = error_body(create_batch(client, batch_file(BIG, None, BIG, SMALL)), 400)
    assert mixed["code"] == "mixed_models"
    assert "Line 4" in mixed["message"] and "line 1" in mixed["message"]


def test_instances_name_their_model_and_hardware(client: FlaskClient) -> None:
    data = client.get("/v1/instances").get_json()["data"]
    shown = {i["id"]: (i["model"], i["model_path"], i["hardware"], i["alive"]) for i in data}
    assert shown == {"gpu.0": (BIG, f"/models/{BIG}", "cpu", True),
                     "gpu.1": (SMALL, f"/models/{SMALL}", "cpu", False)}


def test_declaring_a_model_again_updates_its_row(fresh_services: Settings) -> None:
    """Engines that start together declare one model at once: an upsert, never a unique
    violation; the first declaration's time stays, the path and last time follow."""
    db = Database(fresh_services.resolved_database_url)
    try:
        for path in ("/models/a", "/models/b"):
            with db.session() as session:
                served_models.declare(session, "twice", path)
        with db.session() as session:
            row = session.get(ServedModel, "twice")
            assert row is not None and row.model_path == "/models/b"
            assert row.first_declared_at <= row.last_declared_at
    finally:
        db.dispose()
