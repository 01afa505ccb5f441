"""The API while its Redis is down (nothing listens at its address): submissions are still
accepted and persisted with their message in the outbox (the relay sends it once Redis is back),
reads work, and the rate limit counts in this process instead of failing the call. Real
PostgreSQL."""

from __future__ import annotations

import time

import pytest
from flask.testing import FlaskClient
from sqlalchemy import select

from domain.models import InferenceRequest, OutboxEntry, RequestStatus
from domain.settings import Settings
from tests.app.flask_client import api_client, error_body, services_of
from tests.environment import free_port

pytestmark = pytest.mark.services


@pytest.fixture
def client(fresh_services: Settings) -> FlaskClient:
    down = f"redis://127.0.0.1:{free_port()}/0"
    return api_client(fresh_services.model_copy(update={"redis_url": down}), rate_limit_rpm=3)


def test_a_submission_is_accepted_and_persisted_while_redis_is_down(client: FlaskClient) -> None:
    started = time.monotonic()
    response = client.post("/v1/requests", json={"prompt": "Hello there", "max_tokens": 8})
    assert response.status_code == 202, response.get_data(as_text=True)
    request_id = response.get_json()["id"]
    with services_of(client).db.session() as session:
        request = session.get(InferenceRequest, request_id)
        assert request is not None and request.status == RequestStatus.QUEUED
        staged = session.scalars(select(OutboxEntry)).all()
        assert [(e.task, e.args) for e in staged] == [("predict.annotate", [request_id])]
    shown = client.get(f"/v1/requests/{request_id}")
    assert shown.status_code == 200 and shown.get_json()["status"] == "queued"
    assert time.monotonic() - started < 30


def test_the_rate_limit_still_holds_per_process_while_redis_is_down(client: FlaskClient) -> None:
    statuses = [client.get("/v1/requests/req_missing").status_code for _ in range(4)]
    assert statuses[:3] == [404, 404, 404]
    error = error_body(client.get("/v1/requests/req_missing"), 429)
    assert error["code"] == "rate_limit_exceeded"


CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


@pytest.mark.parametrize("stream", [False, True])
def test_a_held_completion_is_refused_at_once_while_redis_is_down(
    client: FlaskClient, stream: bool
) -> None:
    """It could not be routed before Redis is back: 503 with Retry-After, and nothing stored
    (the client retries, or submits asynchronously)."""
    response = client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    error = error_body(response, 503)
    assert error["code"] == "service_unavailable"
    assert int(response.headers["Retry-After"]) >= 1
    with services_of(client).db.session() as session:
        assert session.scalars(select(InferenceRequest)).all() == []


def test_an_accept_does_not_wait_for_the_broker(client: FlaskClient) -> None:
    """The submission is answered right after its commit, while the API's outbox sender is
    still meeting the broker's outage (kombu retries its connection for seconds); the message
    stays staged for the relay."""
    response = client.post("/v1/requests", json={"prompt": "Hello there", "max_tokens": 8})
    assert response.status_code == 202, response.get_data(as_text=True)
    outbox = services_of(client).outbox
    assert not outbox.flush(timeout_s=0)  # the send is still in flight: nobody waited for it
    with services_of(client).db.session() as session:
        staged = session.scalars(select(OutboxEntry)).all()
        assert [e.args for e in staged] == [[response.get_json()["id"]]]
