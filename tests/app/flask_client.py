"""What the API tests do through Flask's test client: an authenticated client, a team's key, the
app's services, an upload, the error body of a refusal."""

from __future__ import annotations

import io
from typing import Any

from flask.testing import FlaskClient

from app import create_app
from app.api.services import services
from domain.services import Services
from domain.settings import Settings
from domain.teams import ensure_team_key

#: A one-line batch input file.
JSONL = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}\n'


def services_of(client: FlaskClient) -> Services:
    with client.application.app_context():
        return services()


def team_key(client: FlaskClient, team: str, **options: Any) -> str:
    """The API key of `team`, created (with `options`) when it does not exist yet."""
    with services_of(client).db.session() as session:
        return ensure_team_key(session, team, **options).key


def upload(client: FlaskClient, content: bytes = JSONL, *, name: str = "input.jsonl",
           purpose: str = "batch", **headers: str) -> Any:
    """POST /v1/files, as multipart form data."""
    return client.post("/v1/files", data={"purpose": purpose, "file": (io.BytesIO(content), name)},
                       content_type="multipart/form-data", headers=headers)


def error_body(response: Any, status: int) -> dict[str, Any]:
    """The OpenAI-style error of a response that must have `status`."""
    assert response.status_code == status, response.get_data(as_text=True)
    body = response.get_json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def api_client(settings: Settings, *, key: str | None = None, team: str = "tests",
               **team_options: Any) -> FlaskClient:
    """A test client of an API on `settings`, authenticated with `key` (default: a new key of
    `team`, made through the API's own database)."""
    app = create_app(settings)
    app.testing = True
    client = app.test_client()
    key = key or team_key(client, team, **team_options)
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    return client
