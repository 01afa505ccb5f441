"""GET /metrics behind the metrics token, and cheap to scrape: finished requests are counted at
most every `metrics_counts_cache_s`, never at every scrape (PostgreSQL and Redis)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr
from sqlalchemy import event

from domain.models import InferenceRequest, utcnow
from domain.settings import Settings
from tests.app.flask_client import api_client, error_body, services_of

pytestmark = pytest.mark.services

TOKEN = "metrics-token-for-tests-0123456789"


def requests_gauge(client: FlaskClient, **headers: str) -> dict[str, float]:
    """blockq_requests by status (priority interactive) from one scrape."""
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.get_data(as_text=True)
    return {sample.labels["status"]: sample.value
            for family in text_string_to_metric_families(response.get_data(as_text=True))
            for sample in family.samples
            if sample.name == "blockq_requests" and sample.labels["priority"] == "interactive"}


def add_requests(client: FlaskClient, status: str, num: int) -> None:
    now = utcnow()
    with services_of(client).db.session() as session:
        session.add_all(InferenceRequest(
            id=f"req_{status}_{time.monotonic_ns()}_{n}", status=status, priority="interactive",
            prompt="p", max_tokens=8, temperature=1.0, top_p=1.0, body_sha256="0" * 64,
            prompt_tokens=1, created_at=now, updated_at=now) for n in range(num))


@contextmanager
def statements_on_requests(client: FlaskClient) -> Iterator[list[str]]:
    """Every SQL statement reading the requests table while the block runs."""
    seen: list[str] = []
    engine = services_of(client).db.engine

    def record(_conn, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        if "FROM requests" in statement:
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


# --- the token -------------------------------------------------------------------------------
def test_without_a_token_setting_metrics_are_open(fresh_services: Settings) -> None:
    client = api_client(fresh_services)
    client.environ_base.pop("HTTP_AUTHORIZATION")
    assert client.get("/metrics").status_code == 200


def test_with_a_token_only_that_bearer_token_may_scrape(fresh_services: Settings) -> None:
    client = api_client(fresh_services.model_copy(update={"metrics_token": SecretStr(TOKEN)}))
    team_key = client.environ_base.pop("HTTP_AUTHORIZATION")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                    {"Authorization": f"Basic {TOKEN}"}, {"Authorization": team_key}):
        error = error_body(client.get("/metrics", headers=headers), 401)
        assert error["code"] == "invalid_metrics_token" and "metrics token" in error["message"]
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200 and b"blockq_requests" in response.data


# --- cheap to scrape -------------------------------------------------------------------------
def test_finished_requests_are_counted_at_most_every_cache_period(
        fresh_services: Settings) -> None:
    client = api_client(fresh_services.model_copy(update={"metrics_counts_cache_s": 0.5}))
    add_requests(client, "succeeded", 3)
    assert requests_gauge(client)["succeeded"] == 3

    add_requests(client, "succeeded", 2)
    add_requests(client, "running", 4)
    with statements_on_requests(client) as seen:
        got = requests_gauge(client)
    assert got["succeeded"] == 3, "finished requests were counted again within the period"
    assert got["running"] == 4, "requests in flight are counted at every scrape"
    # The one statement of this scrape asks only for statuses in flight (the status index).
    assert len(seen) == 1 and "WHERE requests.status IN" in seen[0]

    time.sleep(0.6)
    assert requests_gauge(client)["succeeded"] == 5


def test_every_api_process_shares_the_cached_counts(fresh_services: Settings) -> None:
    """Two API processes (two apps): the second scrape reads what the first counted."""
    settings = fresh_services.model_copy(update={"metrics_counts_cache_s": 60})
    first, second = api_client(settings), api_client(settings, team="second")
    add_requests(first, "failed", 2)
    assert requests_gauge(first)["failed"] == 2
    add_requests(first, "failed", 1)
    with statements_on_requests(second) as seen:
        assert requests_gauge(second)["failed"] == 2
    assert len(seen) == 1
