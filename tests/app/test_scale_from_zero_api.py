"""Scale from zero at the API (real PostgreSQL and Redis, no engine): with autoscaling on, a model
the fleet can start is listed and accepted while no instance of it is up; a held completion waits
for the cold start, and past autoscale_max_wait_s gets a 503 with Retry-After, its request
cancelled (it will not run later)."""

from __future__ import annotations

import json

import pytest
from flask.testing import FlaskClient

from domain.models import InferenceRequest
from domain.settings import Settings
from tests.app.flask_client import api_client, error_body, services_of

pytestmark = pytest.mark.services

COLD, FIXED = "cold-model", "fixed-model"
FLEET = json.dumps([
    {"model": COLD, "count": 0, "min_count": 0, "max_count": 2, "engine": "emulated",
     "start_s": 30},
    {"model": FIXED, "engine": "emulated"},
])


@pytest.fixture
def client(fresh_services: Settings) -> FlaskClient:
    """An API of an autoscaled fleet, no instance of which is up."""
    return api_client(fresh_services.model_copy(update={
        "fleet": Settings(fleet=FLEET).fleet, "autoscale": True,
        "autoscale_max_wait_s": 0.5}))


def test_models_lists_what_can_be_served_from_zero(client: FlaskClient) -> None:
    # Every model the autoscaler can start, none of them live.
    assert [m["id"] for m in client.get("/v1/models").get_json()["data"]] == [COLD, FIXED]
    assert client.get(f"/v1/models/{COLD}").get_json()["id"] == COLD


@pytest.mark.parametrize("stream", [False, True])
def test_a_held_call_past_the_max_wait_gets_503_with_retry_after_and_is_cancelled(
        client: FlaskClient, stream: bool) -> None:
    answer = client.post("/v1/completions", json={"model": COLD, "prompt": "Hello",
                                                  "max_tokens": 2, "stream": stream})
    error = error_body(answer, 503)
    assert error["code"] == "model_cold_start_timeout" and error["param"] == "model"
    assert COLD in error["message"] and "0.5 s" in error["message"]
    assert int(answer.headers["Retry-After"]) >= 1
    with services_of(client).db.session() as session:
        statuses = {row.status for row in session.query(InferenceRequest).filter_by(model=COLD)}
    assert statuses == {"cancelled"}

