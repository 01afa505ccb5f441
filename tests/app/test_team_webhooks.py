"""Webhook destinations refused at submission (no DNS needed), and per-team signing secrets:
shown once at team creation, rotated from the CLI and the admin API, on PostgreSQL."""

from __future__ import annotations

import time
from typing import Any

import pytest
from click.testing import CliRunner
from flask.testing import FlaskClient

from app.api.contract import TeamWebhookSecretObject
from app.cli import main as cli
from domain.settings import Settings
from domain.team_secrets import secrets_in_force
from domain.teams import team_by_name
from tests.app.flask_client import api_client, error_body, services_of, team_key

pytestmark = pytest.mark.services


@pytest.fixture
def client(fresh_services: Settings) -> FlaskClient:
    return api_client(fresh_services)


def _submit(client: FlaskClient, webhook_url: str) -> Any:
    return client.post("/v1/requests", json={"prompt": "Hello", "max_tokens": 4,
                                             "webhook_url": webhook_url})


@pytest.mark.parametrize(("url", "named"), [
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254: it is a link-local address"),
    ("http://[fd00::1]/hook", "fd00::1: it is a private address"),
    ("http://10.1.2.3:8080/hook", "10.1.2.3: it is a private address"),
    ("http://100.64.0.7/hook", "carrier-grade NAT"),
    ("http://[::ffff:192.168.0.1]/hook", "a private address"),
    ("http://0.0.0.0:5432/", "the unspecified address"),
    ("http://2130706433/", "127.0.0.1: it is a loopback address"),  # 127.0.0.1 as one number
    ("http://user:secret@hooks.example.com/", "may not carry credentials"),
    ("https://hooks.example.com/" + "a" * 2100, "at most 2048 characters"),
])
def test_a_refused_webhook_url_is_a_400_naming_the_problem(
    fresh_services: Settings, url: str, named: str,
) -> None:
    client = api_client(fresh_services.model_copy(update={"webhook_allowed_networks": ()}))
    error = error_body(_submit(client, url), 400)
    assert error["param"] == "webhook_url" and named in error["message"], error


def test_loopback_is_accepted_only_when_allow_listed(fresh_services: Settings) -> None:
    allowed = api_client(fresh_services)  # the tests' settings allow 127.0.0.0/8
    assert _submit(allowed, "http://127.0.0.1:9/hook").status_code == 202
    strict = api_client(fresh_services.model_copy(update={"webhook_allowed_networks": ()}),
                        team="strict")
    assert "loopback" in error_body(_submit(strict, "http://127.0.0.1:9/hook"), 400)["message"]
    # A host name is accepted: what it resolves to is checked at each delivery.
    assert _submit(strict, "https://hooks.example.com/x").status_code == 202


def _secrets(client: FlaskClient, team: str) -> list[str]:
    with services_of(client).db.session() as session:
        return secrets_in_force(session, team_by_name(session, team).id)


def test_the_admin_api_rotates_a_team_secret_keeping_the_old_one_for_the_grace(
    client: FlaskClient,
) -> None:
    admin = {"Authorization": f"Bearer {team_key(client, 'ops', is_admin=True)}"}
    team_key(client, "payments")
    (before,) = _secrets(client, "payments")
    with services_of(client).db.session() as session:
        team_id = team_by_name(session, "payments").id

    response = client.post(f"/v1/admin/teams/{team_id}/webhook_secret/rotate", headers=admin)

    assert response.status_code == 200, response.get_data(as_text=True)
    body = TeamWebhookSecretObject.model_validate(response.get_json()).model_dump()
    assert body["object"] == "team.webhook_secret" and body["team_id"] == team_id
    assert body["secret"].startswith("whsec_") and body["secret"] != before
    grace = services_of(client).settings.webhook_secret_grace_s
    assert abs(body["previous_valid_until"] - (time.time() + grace)) < 60
    assert _secrets(client, "payments") == [body["secret"], before]
    assert _secrets(client, "ops") != _secrets(client, "payments")


def test_only_admins_rotate_and_an_unknown_team_is_404(client: FlaskClient) -> None:
    with services_of(client).db.session() as session:
        team_id = team_by_name(session, "tests").id
    refused = client.post(f"/v1/admin/teams/{team_id}/webhook_secret/rotate")
    assert error_body(refused, 403)["code"] == "admin_only"
    admin = {"Authorization": f"Bearer {team_key(client, 'ops', is_admin=True)}"}
    missing = client.post("/v1/admin/teams/team_nope/webhook_secret/rotate", headers=admin)
    assert "team_nope" in error_body(missing, 404)["message"]


def test_the_cli_shows_a_new_team_its_secret_once_and_rotates_it(
    fresh_services: Settings, monkeypatch: pytest.MonkeyPatch, client: FlaskClient,
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_services.resolved_database_url)
    runner = CliRunner()
    created = runner.invoke(cli, ["teams", "create", "research"])
    assert created.exit_code == 0, created.output
    secret = next(line for line in created.output.splitlines() if line.startswith("whsec_"))
    assert _secrets(client, "research") == [secret]
    listed = runner.invoke(cli, ["teams", "list"])
    assert secret not in listed.output  # shown once, never listed

    rotated = runner.invoke(cli, ["teams", "rotate-webhook-secret", "research"])
    assert rotated.exit_code == 0, rotated.output
    new = rotated.output.strip().splitlines()[-1]
    assert "stays valid until" in rotated.output
    assert _secrets(client, "research") == [new, secret]

    missing = runner.invoke(cli, ["teams", "rotate-webhook-secret", "nobody"])
    assert missing.exit_code != 0 and "No team named 'nobody'" in missing.output


@pytest.mark.parametrize(("url", "named"), [
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://0x7f.1:5432/", "127.0.0.1: it is a loopback address"),  # the resolver's forms too
    ("http://2130706433/", "127.0.0.1: it is a loopback address"),
])
def test_the_cli_refuses_an_internal_team_webhook_url(
    fresh_services: Settings, monkeypatch: pytest.MonkeyPatch, url: str, named: str,
) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_services.resolved_database_url)
    monkeypatch.setenv("BLOCKQ_WEBHOOK_ALLOWED_NETWORKS", "")
    refused = CliRunner().invoke(cli, ["teams", "create", "sneaky", "--webhook-url", url])
    assert refused.exit_code != 0 and named in refused.output, refused.output
