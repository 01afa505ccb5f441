"""The Batch API's validation and bookkeeping against the real PostgreSQL and Redis (no workers:
batches stay `validating` unless a test moves them)."""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import update

from app import create_app
from domain.models import Batch, BatchStatus, StoredFile
from domain.settings import Settings
from tests.app.flask_client import error_body, services_of, team_key, upload

pytestmark = pytest.mark.services


@pytest.fixture
def client(fresh_services: Settings) -> FlaskClient:
    app = create_app(fresh_services)
    app.testing = True
    test_client = app.test_client()
    test_client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {team_key(test_client, 'tests')}"
    return test_client


def _create(client: FlaskClient, **body: Any) -> Any:
    return client.post("/v1/batches", json={
        "endpoint": "/v1/chat/completions", "completion_window": "24h", **body})


def test_create_answers_a_validating_batch_object(client: FlaskClient) -> None:
    file_id = upload(client).get_json()["id"]
    response = _create(client, input_file_id=file_id, metadata={"job": "nightly"})
    assert response.status_code == 200, response.get_data(as_text=True)
    batch = response.get_json()
    assert batch["id"].startswith("batch_") and batch["object"] == "batch"
    assert batch["status"] == "validating" and batch["input_file_id"] == file_id
    assert batch["endpoint"] == "/v1/chat/completions" and batch["completion_window"] == "24h"
    assert batch["expires_at"] - batch["created_at"] == 24 * 3600
    assert batch["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert batch["metadata"] == {"job": "nightly"}
    assert batch["output_file_id"] is None and batch["errors"] is None
    assert client.get(f"/v1/batches/{batch['id']}").get_json() == batch


def test_create_refuses_what_openai_refuses(client: FlaskClient) -> None:
    file_id = upload(client).get_json()["id"]
    cases = [
        ({"input_file_id": file_id, "endpoint": "/v1/embeddings"}, "endpoint"),
        ({"input_file_id": "file-missing"}, "input_file_id"),
        ({"input_file_id": file_id, "completion_window": "48h"}, "completion_window"),
        ({"input_file_id": file_id, "metadata": {"k": "v" * 513}}, "metadata"),
        ({"input_file_id": file_id, "priority": "high"}, "priority"),
        ({}, "input_file_id"),
    ]
    for body, param in cases:
        error = error_body(_create(client, **body), 400)
        assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert error_body(client.post("/v1/batches", data="not json"), 400)["code"] == "invalid_json"


def test_an_output_file_is_no_input(client: FlaskClient) -> None:
    file_id = upload(client).get_json()["id"]
    with services_of(client).db.session() as session:
        session.execute(update(StoredFile).values(purpose="batch_output"))
    error = error_body(_create(client, input_file_id=file_id), 400)
    assert error["param"] == "input_file_id" and "purpose 'batch'" in error["message"]


def test_batches_are_visible_only_to_their_team(client: FlaskClient) -> None:
    batch_id = _create(client, input_file_id=upload(client).get_json()["id"]).get_json()["id"]
    other = {"Authorization": f"Bearer {team_key(client, 'others')}"}
    missing = error_body(client.get(f"/v1/batches/{batch_id}", headers=other), 404)
    assert missing["code"] == "not_found"
    assert error_body(client.post(f"/v1/batches/{batch_id}/cancel", headers=other), 404)
    assert client.get("/v1/batches", headers=other).get_json()["data"] == []
    # Another team's file is no input either.
    other_file = upload(client, **other).get_json()["id"]
    assert error_body(_create(client, input_file_id=other_file), 400)["param"] == "input_file_id"


def test_list_pages_newest_first(client: FlaskClient) -> None:
    file_id = upload(client).get_json()["id"]
    ids = [_create(client, input_file_id=file_id).get_json()["id"] for _ in range(3)]
    page = client.get("/v1/batches?limit=2").get_json()
    assert [b["id"] for b in page["data"]] == ids[::-1][:2] and page["has_more"] is True
    rest = client.get(f"/v1/batches?after={page['last_id']}").get_json()
    assert [b["id"] for b in rest["data"]] == ids[:1] and rest["has_more"] is False
    assert error_body(client.get("/v1/batches?limit=101"), 400)["param"] == "limit"


def test_cancel_is_idempotent_and_refused_once_finished(client: FlaskClient) -> None:
    file_id = upload(client).get_json()["id"]
    batch_id = _create(client, input_file_id=file_id).get_json()["id"]
    cancelling = client.post(f"/v1/batches/{batch_id}/cancel").get_json()
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"] is not None
    assert client.post(f"/v1/batches/{batch_id}/cancel").get_json() == cancelling

    finished = _create(client, input_file_id=file_id).get_json()["id"]
    with services_of(client).db.session() as session:
        session.execute(update(Batch).where(Batch.id == finished)
                        .values(status=BatchStatus.COMPLETED))
    assert error_body(client.post(f"/v1/batches/{finished}/cancel"), 409)["param"] == "id"
