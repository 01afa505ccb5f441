"""Sessions through the API, on PostgreSQL: a request names its conversation with the
x-session-id header (any endpoint), the native body's session_id, or OpenAI's `user`; the
request keeps a digest of it scoped to its team (never the id itself); a bad header is a 400
naming it, in OpenAI's error format, and nothing is stored."""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import select

from domain.models import InferenceRequest, Team
from domain.sessions import session_key
from domain.settings import Settings
from tests.app.flask_client import api_client, error_body, services_of

pytestmark = pytest.mark.services

CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.fixture
def settings(fresh_services: Settings) -> Settings:
    return fresh_services.model_copy(update={"sync_timeout_s": 0.2})


@pytest.fixture
def client(settings: Settings) -> FlaskClient:
    return api_client(settings)


def _keys(client: FlaskClient) -> list[str | None]:
    with services_of(client).db.session() as session:
        return list(session.scalars(select(InferenceRequest.session_key)
                                    .order_by(InferenceRequest.created_at)))


def _team_id(client: FlaskClient, name: str = "tests") -> str:
    with services_of(client).db.session() as session:
        return session.scalars(select(Team.id).where(Team.name == name)).one()


def test_the_header_the_body_field_and_openai_user_name_the_session(
        client: FlaskClient) -> None:
    team = _team_id(client)
    assert client.post("/v1/requests", headers={"x-session-id": "chat-1"},
                       json={"prompt": "Hi", "max_tokens": 2}).status_code == 202
    assert client.post("/v1/requests", json={"prompt": "Hi", "max_tokens": 2,
                                             "session_id": "chat-2"}).status_code == 202
    # OpenAI: the header wins over `user`; `user` alone names the session.
    client.post("/v1/chat/completions", headers={"X-Session-Id": "chat-3"},
                json=CHAT | {"user": "someone"})
    client.post("/v1/completions", json={"model": "tiny-llama", "prompt": "Hi",
                                         "max_tokens": 2, "user": "someone"})
    client.post("/v1/chat/completions", json=CHAT)
    assert _keys(client) == [session_key(team, "chat-1"), session_key(team, "chat-2"),
                             session_key(team, "chat-3"), session_key(team, "someone"), None]


def test_two_teams_with_the_same_session_id_never_share_it(settings: Settings,
                                                           client: FlaskClient) -> None:
    other = api_client(settings, team="others")
    for c in (client, other):
        assert c.post("/v1/requests", headers={"x-session-id": "same"},
                      json={"prompt": "Hi", "max_tokens": 2}).status_code == 202
    keys = _keys(client)
    assert len(set(keys)) == 2 and "same" not in keys


@pytest.mark.parametrize("value", ["", "   ", "x" * 257, "a\tb"], ids=repr)
@pytest.mark.parametrize("path", ["/v1/requests", "/v1/completions", "/v1/chat/completions"])
def test_a_bad_session_header_is_refused_naming_it(client: FlaskClient, path: str,
                                                   value: str) -> None:
    body: dict[str, Any] = ({"prompt": "Hi", "max_tokens": 2} if path == "/v1/requests" else
                            CHAT if "chat" in path else {"model": "tiny-llama", "prompt": "Hi"})
    error = error_body(client.post(path, headers={"x-session-id": value}, json=body), 400)
    assert error["param"] == "x-session-id" and error["code"] == "invalid_value"
    assert _keys(client) == []


@pytest.mark.parametrize("session_id", ["", "x" * 257, 42, None, ["a"]], ids=repr)
def test_a_bad_session_body_field_is_refused(client: FlaskClient, session_id: Any) -> None:
    response = client.post("/v1/requests", json={"prompt": "Hi", "session_id": session_id})
    if session_id is None:
        assert response.status_code == 202  # null: no session
        return
    assert error_body(response, 400)["param"] == "session_id"
    assert _keys(client) == []
