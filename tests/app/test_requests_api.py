"""The native requests API against real PostgreSQL and Redis (no workers: nothing consumes)."""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import select

from app import create_app
from domain import request_store
from domain.models import InferenceRequest, RequestStatus
from domain.streams import read_stream
from tests.app.flask_client import services_of, team_key
from tests.engine_states import engine_state

pytestmark = pytest.mark.services


@pytest.fixture
def client(fresh_services) -> FlaskClient:  # type: ignore[no-untyped-def]
    """A test client authenticated as the team "tests"."""
    app = create_app(fresh_services)
    app.testing = True
    test_client = app.test_client()
    test_client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {team_key(test_client, 'tests')}"
    return test_client


def _error(response) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    body = response.get_json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_submit_answers_202_with_status_url_and_persists_queued(client: FlaskClient) -> None:
    response = client.post("/v1/requests", json={"prompt": "Hello there", "max_tokens": 8})
    assert response.status_code == 202
    body = response.get_json()
    assert body["id"].startswith("req_") and body["status"] == "queued"
    assert body["status_url"].endswith(f"/v1/requests/{body['id']}")
    shown = client.get(f"/v1/requests/{body['id']}").get_json()
    assert shown["status"] == "queued"
    assert shown["prompt_tokens"] > 0 and shown["max_tokens"] == 8
    assert [e["status"] for e in shown["events"]] == ["queued"]


def test_chat_messages_are_rendered_with_the_template(client: FlaskClient) -> None:
    response = client.post(
        "/v1/requests",
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    )
    assert response.status_code == 202
    request_id = response.get_json()["id"]
    with services_of(client).db.session() as session:
        prompt = request_store.get_request(session, request_id).prompt
    assert "Hi" in prompt and prompt != "Hi"


def test_idempotency_same_body_same_request_other_body_conflict(client: FlaskClient) -> None:
    body = {"prompt": "Write a haiku", "max_tokens": 16, "metadata": {"a": 1}}
    first = client.post("/v1/requests", json=body, headers={"Idempotency-Key": "k-1"})
    # Same body with other key order: still the same request.
    again = client.post(
        "/v1/requests",
        json={"metadata": {"a": 1}, "max_tokens": 16, "prompt": "Write a haiku"},
        headers={"Idempotency-Key": "k-1"},
    )
    assert first.status_code == again.status_code == 202
    assert first.get_json()["id"] == again.get_json()["id"]
    assert first.get_json()["created"] is True and again.get_json()["created"] is False
    other = client.post(
        "/v1/requests", json={**body, "max_tokens": 17}, headers={"Idempotency-Key": "k-1"}
    )
    assert other.status_code == 409
    assert _error(other)["param"] == "Idempotency-Key"


def test_two_idempotency_key_headers_are_refused_not_joined(client: FlaskClient) -> None:
    """A WSGI server joins repeated headers with commas: "a" and "b" would become the key
    "a,b", a request neither retry of "a" nor of "b" finds."""
    body = {"prompt": "Write a haiku", "max_tokens": 16}
    twice = client.post("/v1/requests", json=body,
                        headers=[("Idempotency-Key", "a"), ("Idempotency-Key", "b")])
    assert twice.status_code == 400
    error = _error(twice)
    assert error["param"] == "Idempotency-Key" and "one Idempotency-Key" in error["message"]
    comma = client.post("/v1/requests", json=body, headers={"Idempotency-Key": "a,b"})
    assert comma.status_code == 400 and _error(comma)["param"] == "Idempotency-Key"
    with services_of(client).db.session() as session:
        assert session.scalars(select(InferenceRequest)).all() == []  # nothing was stored
    once = client.post("/v1/requests", json=body, headers={"Idempotency-Key": "a"})
    assert once.status_code == 202 and once.get_json()["created"] is True


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": 5}, "prompt"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "temperature": 3}, "temperature"),
        ({"prompt": "x", "top_p": 0}, "top_p"),
        ({"prompt": "x", "priority": "urgent"}, "priority"),
        ({"prompt": "x", "webhook_url": "ftp://example.invalid/x"}, "webhook_url"),
        ({"prompt": "x", "bogus": 1}, "bogus"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"prompt": ""}, "prompt"),
    ],
)
def test_invalid_fields_are_400_naming_the_field(
    client: FlaskClient, body: dict[str, Any], param: str
) -> None:
    response = client.post("/v1/requests", json=body)
    assert response.status_code == 400
    error = _error(response)
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_malformed_json_is_400(client: FlaskClient) -> None:
    response = client.post("/v1/requests", data="{not json", content_type="application/json")
    assert response.status_code == 400
    assert _error(response)["code"] == "invalid_json"
    assert client.post("/v1/requests", json=[1, 2]).status_code == 400


def test_oversized_body_is_413(client: FlaskClient) -> None:
    huge = "word " * (client.application.config["MAX_CONTENT_LENGTH"] // 4)
    response = client.post("/v1/requests", json={"prompt": huge})
    assert response.status_code == 413
    assert _error(response)["code"] == "request_too_large"


def test_prompt_longer_than_context_is_422_at_the_api(client: FlaskClient) -> None:
    long_prompt = "antidisestablishmentarianism " * 3000
    response = client.post("/v1/requests", json={"prompt": long_prompt})
    assert response.status_code == 422
    error = _error(response)
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    too_many = client.post("/v1/requests", json={"prompt": "hi", "max_tokens": 100_000})
    assert too_many.status_code == 422 and _error(too_many)["param"] == "max_tokens"


def test_unknown_request_is_404(client: FlaskClient) -> None:
    assert client.get("/v1/requests/req_nope").status_code == 404
    response = client.post("/v1/requests/req_nope/cancel")
    assert response.status_code == 404 and _error(response)["code"] == "not_found"
    assert _error(client.get("/v1/nothing-here"))["code"] == "not_found"


def test_cancel_queued_then_again_then_finished_is_409(client: FlaskClient) -> None:
    request_id = client.post("/v1/requests", json={"prompt": "x", "max_tokens": 4}).get_json()["id"]
    cancelled = client.post(f"/v1/requests/{request_id}/cancel")
    assert cancelled.status_code == 200
    body = cancelled.get_json()
    assert body["status"] == "cancelled" and body["finished_at"] is not None
    assert [e["status"] for e in body["events"]] == ["queued", "cancelled"]
    assert client.post(f"/v1/requests/{request_id}/cancel").status_code == 200
    svc = services_of(client)
    assert svc.fleet.cancelled([request_id]) == {request_id}
    # Whoever waits for its end (a held completion) reads it on the stream at once, no poll.
    ended = next(read_stream(svc.fleet.redis, request_id, block_ms=100))
    assert ended is not None and ended.kind == "error" and ended.attempt == 0

    other = client.post("/v1/requests", json={"prompt": "y", "max_tokens": 4}).get_json()["id"]
    with svc.db.session() as session:
        assert request_store.transition(
            session, other, RequestStatus.SUCCEEDED, allowed_from=request_store.ACTIVE_STATUSES
        )
    late = client.post(f"/v1/requests/{other}/cancel")
    assert late.status_code == 409 and _error(late)["code"] == "request_already_finished"


def test_transition_is_guarded_so_completion_happens_once(client: FlaskClient) -> None:
    request_id = client.post("/v1/requests", json={"prompt": "x", "max_tokens": 4}).get_json()["id"]
    svc = services_of(client)
    with svc.db.session() as session:
        first = request_store.transition(
            session, request_id, RequestStatus.SUCCEEDED, allowed_from=request_store.ACTIVE_STATUSES
        )
        second = request_store.transition(
            session, request_id, RequestStatus.SUCCEEDED, allowed_from=request_store.ACTIVE_STATUSES
        )
    assert (first, second) == (True, False)
    events = client.get(f"/v1/requests/{request_id}").get_json()["events"]
    assert [e["status"] for e in events].count("succeeded") == 1


def test_health_and_readiness(client: FlaskClient, fresh_services) -> None:  # type: ignore[no-untyped-def]
    assert client.get("/healthz").get_json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.get_json()["checks"] == {
        "database": "ok",
        "broker": "ok",
    }
    broken = create_app(fresh_services.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"}))
    response = broken.test_client().get("/readyz")
    assert response.status_code == 503 and response.get_json()["checks"]["broker"] != "ok"


def test_instances_lists_published_state_and_heartbeat_age(client: FlaskClient) -> None:
    svc = services_of(client)
    svc.fleet.publish(
        "gpu.0",
        engine_state(engine_kind="vllm", model="tiny-llama", num_running=3, num_waiting=1,
                     num_free_blocks=90, num_total_blocks=100, max_num_seqs=48,
                     max_num_batched_tokens=512, block_size=16, max_model_len=2048,
                     model_path="/models/tiny-llama", hardware="cpu"),
    )
    data = client.get("/v1/instances").get_json()["data"]
    assert len(data) == 1
    inst = data[0]
    assert 0 <= inst.pop("seconds_since_heartbeat") < 5
    assert inst == {
        "id": "gpu.0", "object": "instance", "alive": True, "accepting": True, "control": None,
        "engine_kind": "vllm", "model": "tiny-llama", "model_path": "/models/tiny-llama",
        "hardware": "cpu", "exec_model": None, "capacity_rps": None, "running": 3, "waiting": 1,
        "assigned": 0,
        "free_kv_blocks": 90, "total_kv_blocks": 100,
        "config": {"max_num_seqs": 48, "max_num_batched_tokens": 512, "block_size": 16,
                   "max_model_len": 2048},
    }
    svc.fleet.publish("gpu.1", engine_state(engine_kind="vllm", accepting=False))
    assert [s.instance_id for s in svc.fleet.routable()] == ["gpu.0"]
    svc.fleet.mark_stopped("gpu.0")
    assert client.get("/v1/instances").get_json()["data"][0]["alive"] is False
    assert svc.fleet.routable() == []
