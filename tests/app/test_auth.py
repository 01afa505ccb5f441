"""Teams and API keys: authentication, team isolation, per-team rate limits, admin commands."""

from __future__ import annotations

import time
from typing import Any

import pytest
from click.testing import CliRunner
from flask.testing import FlaskClient
from sqlalchemy import select

from app import create_app
from app.cli import main as cli
from domain.models import ApiKey, Team
from domain.settings import Settings
from domain.teams import create_team, issue_key, revoke_key
from tests.app.flask_client import services_of, team_key

pytestmark = pytest.mark.services

BODY = {"prompt": "Hello there", "max_tokens": 8}


@pytest.fixture
def anonymous(fresh_services: Settings) -> FlaskClient:
    app = create_app(fresh_services)
    app.testing = True
    return app.test_client()


def _as(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.get_data(as_text=True)
    body = response.get_json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_every_v1_endpoint_needs_a_valid_key_and_probes_do_not(anonymous: FlaskClient) -> None:
    assert _error(anonymous.post("/v1/requests", json=BODY), 401)["code"] == "missing_api_key"
    assert _error(anonymous.get("/v1/instances"), 401)["code"] == "missing_api_key"
    wrong = _error(anonymous.get("/v1/instances", headers=_as("bq-not-a-key-at-all")), 401)
    assert wrong["code"] == "invalid_api_key" and "not-a-key-at-all" not in wrong["message"]
    assert _error(anonymous.get("/v1/instances", headers={"Authorization": "Basic abc"}),
                  401)["code"] == "missing_api_key"
    assert anonymous.get("/healthz").status_code == 200


def test_health_answers_as_vllms_server_does_without_a_key(anonymous: FlaskClient) -> None:
    """200 and an empty body (vLLM's api_server), which third-party benchmark clients check."""
    response = anonymous.get("/health")
    assert response.status_code == 200 and response.get_data() == b""


def test_a_revoked_key_stops_working_at_once(anonymous: FlaskClient) -> None:
    with services_of(anonymous).db.session() as session:
        issued = issue_key(session, create_team(session, "acme"))
    assert anonymous.post("/v1/requests", json=BODY, headers=_as(issued.key)).status_code == 202
    cache = services_of(anonymous).principals  # the API's key cache (domain/principal_cache.py)
    before = cache.generation
    with services_of(anonymous).db.session() as session:
        revoke_key(session, issued.key_id)
    # At the revocation's commit PostgreSQL notifies every API process, whose cache empties:
    # nothing cached outlives the notification (without a listener nothing is cached).
    deadline = time.monotonic() + 10
    while cache.listening and cache.generation == before:
        assert time.monotonic() < deadline, "the key cache never heard of the revocation"
        time.sleep(0.005)
    response = anonymous.post("/v1/requests", json=BODY, headers=_as(issued.key))
    assert _error(response, 401)["code"] == "invalid_api_key"


def test_keys_are_stored_only_as_hashes(anonymous: FlaskClient) -> None:
    key = team_key(anonymous, "acme")
    with services_of(anonymous).db.session() as session:
        row = session.scalars(select(ApiKey)).one()
        stored = [str(getattr(row, column.key)) for column in ApiKey.__table__.columns]
    assert not any(key in value for value in stored)
    assert row.key_prefix == key[:10]


def test_requests_are_visible_only_to_their_team(anonymous: FlaskClient) -> None:
    alice, bob = team_key(anonymous, "alice"), team_key(anonymous, "bob")
    request_id = anonymous.post("/v1/requests", json=BODY, headers=_as(alice)).get_json()["id"]

    assert anonymous.get(f"/v1/requests/{request_id}", headers=_as(alice)).status_code == 200
    assert _error(anonymous.get(f"/v1/requests/{request_id}", headers=_as(bob)),
                  404)["code"] == "not_found"
    assert _error(anonymous.post(f"/v1/requests/{request_id}/cancel", headers=_as(bob)), 404)
    shown = anonymous.get(f"/v1/requests/{request_id}", headers=_as(alice)).get_json()
    assert shown["status"] == "queued"  # bob's cancel changed nothing


def test_idempotency_keys_are_per_team(anonymous: FlaskClient) -> None:
    alice, bob = team_key(anonymous, "alice"), team_key(anonymous, "bob")
    same_key = {"Idempotency-Key": "job-42"}
    first = anonymous.post("/v1/requests", json=BODY, headers={**_as(alice), **same_key})
    other_team = anonymous.post("/v1/requests", json={**BODY, "max_tokens": 9},
                                headers={**_as(bob), **same_key})
    again = anonymous.post("/v1/requests", json=BODY, headers={**_as(alice), **same_key})
    assert first.status_code == other_team.status_code == again.status_code == 202
    assert other_team.get_json()["id"] != first.get_json()["id"]
    assert again.get_json()["id"] == first.get_json()["id"]


def test_rate_limit_answers_429_with_retry_after_for_that_team_only(
    anonymous: FlaskClient,
) -> None:
    with services_of(anonymous).db.session() as session:
        limited = issue_key(session, create_team(session, "small", rate_limit_rpm=3)).key
    other = team_key(anonymous, "big")
    accepted = [anonymous.post("/v1/requests", json=BODY, headers=_as(limited))
                for _ in range(3)]
    statuses = [response.status_code for response in accepted]
    refused = anonymous.get("/v1/instances", headers=_as(limited))  # one limit over all routes

    assert statuses == [202, 202, 202]
    error = _error(refused, 429)
    assert error["type"] == "requests" and error["code"] == "rate_limit_exceeded"
    assert 0 < int(refused.headers["Retry-After"]) <= 60
    assert all("Retry-After" not in r.headers for r in accepted), "only a refusal says retry"
    assert anonymous.post("/v1/requests", json=BODY, headers=_as(other)).status_code == 202


def test_rate_limit_headers_count_the_team_s_calls_in_the_window(
    anonymous: FlaskClient,
) -> None:
    """The window read with each call's hit (one Redis round trip) gives its headers."""
    with services_of(anonymous).db.session() as session:
        limited = issue_key(session, create_team(session, "counted", rate_limit_rpm=3)).key
    started = time.time()
    answers = [anonymous.get("/v1/instances", headers=_as(limited)) for _ in range(3)]

    assert [r.status_code for r in answers] == [200, 200, 200]
    assert [r.headers["X-RateLimit-Limit"] for r in answers] == ["3", "3", "3"]
    assert [r.headers["X-RateLimit-Remaining"] for r in answers] == ["2", "1", "0"]
    resets = {int(r.headers["X-RateLimit-Reset"]) for r in answers}
    assert len(resets) == 1 and started + 60 <= resets.pop() + 1 <= time.time() + 62
    refused = anonymous.get("/v1/instances", headers=_as(limited))
    assert refused.status_code == 429 and refused.headers["X-RateLimit-Remaining"] == "0"
    assert 0 < int(refused.headers["Retry-After"]) <= 60


def test_admin_commands_create_teams_issue_and_revoke_keys(
    fresh_services: Settings, monkeypatch: pytest.MonkeyPatch, anonymous: FlaskClient,
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_services.resolved_database_url)
    runner = CliRunner()
    created = runner.invoke(cli, ["teams", "create", "research", "--share", "3",
                                  "--rate-limit", "100"])
    assert created.exit_code == 0, created.output
    key = created.output.strip().splitlines()[-1]
    assert key.startswith("bq-")
    assert anonymous.get("/v1/instances", headers=_as(key)).status_code == 200

    again = runner.invoke(cli, ["teams", "create", "research"])
    assert again.exit_code != 0 and "already exists" in again.output
    missing = runner.invoke(cli, ["keys", "create", "--team", "nobody"])
    assert missing.exit_code != 0 and "No team named 'nobody'" in missing.output

    with services_of(anonymous).db.session() as session:
        team = session.scalars(select(Team).where(Team.name == "research")).one()
        assert (team.share, team.rate_limit_rpm) == (3, 100)
        key_id = session.scalars(select(ApiKey.id).where(ApiKey.team_id == team.id)).one()
    principals = services_of(anonymous).principals
    before = principals.generation
    revoked = runner.invoke(cli, ["keys", "revoke", key_id])
    assert revoked.exit_code == 0, revoked.output
    # The API's key cache is emptied when PostgreSQL's notification of the change arrives.
    deadline = time.monotonic() + 10
    while principals.listening and principals.generation == before:
        assert time.monotonic() < deadline, "the revocation's notification never arrived"
        time.sleep(0.01)
    assert anonymous.get("/v1/instances", headers=_as(key)).status_code == 401
