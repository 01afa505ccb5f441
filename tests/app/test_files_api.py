"""The Files API against the real PostgreSQL and Redis (no workers): upload, list with cursors,
show, download, delete, team isolation and the size limit."""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient

from app import create_app
from domain.settings import Settings
from tests.app.flask_client import JSONL, error_body, services_of, team_key, upload

pytestmark = pytest.mark.services


@pytest.fixture
def client(fresh_services: Settings) -> FlaskClient:
    """A test client authenticated as the team "tests", with a 4 KiB file size limit."""
    app = create_app(fresh_services.model_copy(update={"max_file_bytes": 4096}))
    app.testing = True
    test_client = app.test_client()
    test_client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {team_key(test_client, 'tests')}"
    return test_client


def test_upload_show_download_delete(client: FlaskClient) -> None:
    created = upload(client, name="../../etc/input.jsonl")
    assert created.status_code == 200, created.get_data(as_text=True)
    file = created.get_json()
    assert file["id"].startswith("file-") and file["object"] == "file"
    assert (file["bytes"], file["filename"], file["purpose"]) == (len(JSONL), "input.jsonl",
                                                                  "batch")
    assert client.get(f"/v1/files/{file['id']}").get_json() == file
    content = client.get(f"/v1/files/{file['id']}/content")
    assert content.status_code == 200 and content.data == JSONL
    stored = services_of(client).settings.resolved_files_dir / file["id"]
    assert stored.read_bytes() == JSONL

    deleted = client.delete(f"/v1/files/{file['id']}")
    assert deleted.get_json() == {"id": file["id"], "object": "file", "deleted": True}
    assert not stored.exists()
    assert error_body(client.get(f"/v1/files/{file['id']}"), 404)["code"] == "not_found"
    assert error_body(client.get(f"/v1/files/{file['id']}/content"), 404)
    assert error_body(client.delete(f"/v1/files/{file['id']}"), 404)


def test_list_pages_newest_first_with_after_limit_and_has_more(client: FlaskClient) -> None:
    ids = [upload(client, name=f"f{i}.jsonl").get_json()["id"] for i in range(5)]
    newest_first = list(reversed(ids))
    first = client.get("/v1/files?limit=2").get_json()
    assert [f["id"] for f in first["data"]] == newest_first[:2] and first["has_more"] is True
    assert (first["object"], first["first_id"], first["last_id"]) == (
        "list", newest_first[0], newest_first[1])
    rest = client.get(f"/v1/files?limit=10&after={first['last_id']}").get_json()
    assert [f["id"] for f in rest["data"]] == newest_first[2:] and rest["has_more"] is False
    oldest = client.get("/v1/files?order=asc&limit=1").get_json()
    assert [f["id"] for f in oldest["data"]] == ids[:1]
    assert client.get("/v1/files?purpose=batch_output").get_json()["data"] == []
    assert error_body(client.get("/v1/files?limit=0"), 400)["param"] == "limit"
    assert error_body(client.get("/v1/files?after=file-nope"), 400)["param"] == "after"


def test_files_are_visible_only_to_their_team(client: FlaskClient) -> None:
    file_id = upload(client).get_json()["id"]
    other = {"Authorization": f"Bearer {team_key(client, 'others')}"}
    assert error_body(client.get(f"/v1/files/{file_id}", headers=other), 404)
    assert error_body(client.get(f"/v1/files/{file_id}/content", headers=other), 404)
    assert error_body(client.delete(f"/v1/files/{file_id}", headers=other), 404)
    assert client.get("/v1/files", headers=other).get_json()["data"] == []
    assert client.get(f"/v1/files/{file_id}").status_code == 200


def test_upload_refusals(client: FlaskClient) -> None:
    wrong_purpose = error_body(upload(client, purpose="fine-tune"), 400)
    assert wrong_purpose["param"] == "purpose" and wrong_purpose["type"] == "invalid_request_error"
    assert error_body(upload(client, purpose="batch_output"), 400)["param"] == "purpose"
    assert error_body(client.post("/v1/files", data={"purpose": "batch"},
                              content_type="multipart/form-data"), 400)["param"] == "file"
    assert error_body(client.post("/v1/files", json={"purpose": "batch"}), 400)["param"] == "file"
    too_large = error_body(upload(client, b"x" * 4097), 413)
    assert too_large["code"] == "file_too_large"
    leftovers = services_of(client).settings.resolved_files_dir
    assert [p.name for p in leftovers.iterdir()] == [".tmp"]
    assert not any((leftovers / ".tmp").iterdir())
    assert error_body(upload(client, b"x" * 100_000), 413)["code"] == "request_too_large"
    assert client.get("/v1/files").get_json()["data"] == []
