"""The API while its database is down (nothing listens at its address): every call that needs
it answers 503 with Retry-After in the OpenAI error shape, never 500; liveness still answers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient

from domain.principal_cache import PrincipalCache
from domain.settings import Settings
from tests.app.flask_client import api_client, error_body
from tests.environment import free_port

pytestmark = pytest.mark.services


@pytest.fixture
def client(fresh_services: Settings) -> Iterator[FlaskClient]:
    down = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/blockq"
    yield api_client(fresh_services.model_copy(update={"database_url": down}),
                     key="sk-any-key")  # no key can be checked: the database is down
    # The process's key cache of that address would try it again for the rest of the run.
    PrincipalCache.shared(down).stop()


@pytest.mark.parametrize(("method", "path", "body"), [
    ("post", "/v1/requests", {"prompt": "Hello", "max_tokens": 8}),
    ("get", "/v1/requests/req_0", None),
    ("post", "/v1/chat/completions",
     {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
    ("get", "/v1/batches", None),
])
def test_calls_needing_the_database_answer_503_with_retry_after(
    client: FlaskClient, method: str, path: str, body: dict[str, object] | None
) -> None:
    response = getattr(client, method)(path, json=body)
    error = error_body(response, 503)
    assert error["code"] == "service_unavailable"
    assert response.headers["Retry-After"].isdigit()


def test_liveness_answers_and_readiness_says_why_not(client: FlaskClient) -> None:
    assert client.get("/healthz").status_code == 200
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.get_json()["checks"]["database"].startswith("error")
