"""Files' `expires_after` (as OpenAI's, through the real `openai` client) and the per-team storage
quota, on PostgreSQL."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator

import httpx
import pytest
from click.testing import CliRunner
from flask.testing import FlaskClient
from openai import OpenAI
from sqlalchemy import select, update

from app.cli import main
from domain.errors import BlockqError
from domain.file_quota import StorageQuotaExceeded, check_quota
from domain.models import StoredFile, Team, utcnow
from domain.retention import purge
from domain.settings import Settings
from tests.app.flask_client import api_client, error_body, services_of, team_key, upload

pytestmark = pytest.mark.services

LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}\n'


@pytest.fixture
def client(fresh_services: Settings) -> FlaskClient:
    return api_client(fresh_services.model_copy(update={"storage_quota_bytes": 3 * len(LINE)}))


@pytest.fixture
def openai_client(client: FlaskClient) -> Iterator[OpenAI]:
    """The real `openai` client, talking to the API in-process (no socket)."""
    http = httpx.Client(transport=httpx.WSGITransport(app=client.application))
    key = client.environ_base["HTTP_AUTHORIZATION"].removeprefix("Bearer ")
    yield OpenAI(base_url="http://blockq.test/v1", api_key=key, http_client=http, max_retries=0)
    http.close()


def stored_ids(client: FlaskClient) -> set[str]:
    root = services_of(client).settings.resolved_files_dir
    if not root.exists():
        return set()
    return {p.name for p in root.iterdir() if p.is_file()} | {
        f".tmp/{p.name}" for p in (root / ".tmp").iterdir()}


# --- expires_after ---------------------------------------------------------------------------
def test_the_openai_client_uploads_with_expires_after_and_sees_expires_at(
        openai_client: OpenAI) -> None:
    created = openai_client.files.create(
        file=("input.jsonl", LINE), purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 3600})
    assert created.expires_at == created.created_at + 3600
    assert openai_client.files.retrieve(created.id).expires_at == created.expires_at
    assert [f.expires_at for f in openai_client.files.list()] == [created.expires_at]
    plain = openai_client.files.create(file=("plain.jsonl", LINE), purpose="batch")
    assert plain.expires_at is None


@pytest.mark.parametrize(("fields", "param"), [
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "3599"},
     "expires_after.seconds"),
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "2592001"},
     "expires_after.seconds"),
    ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "1e9"},
     "expires_after.seconds"),
    ({"expires_after[anchor]": "created_at"}, "expires_after.seconds"),
    ({"expires_after[anchor]": "last_active_at", "expires_after[seconds]": "3600"},
     "expires_after.anchor"),
    ({"expires_after[seconds]": "3600"}, "expires_after.anchor"),
])
def test_expires_after_out_of_openais_bounds_is_refused(client: FlaskClient,
                                                        fields: dict[str, str],
                                                        param: str) -> None:
    response = client.post("/v1/files", data={"purpose": "batch", **fields,
                                              "file": (io.BytesIO(LINE), "in.jsonl")},
                           content_type="multipart/form-data")
    error = error_body(response, 400)
    assert error["param"] == param and "expires_after" in error["message"]
    assert stored_ids(client) == set()  # nothing kept


def test_an_expired_file_is_gone_at_once_and_purged_with_its_bytes(client: FlaskClient) -> None:
    file_id = upload(client).get_json()["id"]
    kept_id = upload(client).get_json()["id"]
    svc = services_of(client)
    with svc.db.session() as session:
        session.execute(update(StoredFile).where(StoredFile.id == file_id)
                        .values(expires_at=utcnow()))
    assert error_body(client.get(f"/v1/files/{file_id}"), 404)["code"] == "not_found"
    assert error_body(client.get(f"/v1/files/{file_id}/content"), 404)
    assert [f["id"] for f in client.get("/v1/files").get_json()["data"]] == [kept_id]
    assert purge(svc.settings, svc.db)["files"] == 1
    assert stored_ids(client) == {kept_id}


# --- the storage quota -----------------------------------------------------------------------
def test_an_upload_past_the_quota_gets_403_naming_used_and_limit(client: FlaskClient) -> None:
    for _ in range(3):
        assert upload(client).status_code == 200
    before = stored_ids(client)
    error = error_body(upload(client), 403)
    assert error["code"] == "storage_quota_exceeded" and error["param"] == "file"
    assert f"stores {3 * len(LINE)} bytes" in error["message"]
    assert f"may store {3 * len(LINE)}" in error["message"]
    assert stored_ids(client) == before  # the refused upload left nothing on disk
    # Deleting a file makes room again.
    client.delete(f"/v1/files/{sorted(before)[0]}")
    assert upload(client).status_code == 200


def test_the_quota_is_per_team_with_a_per_team_override(client: FlaskClient) -> None:
    for _ in range(3):
        upload(client)
    assert upload(client).status_code == 403
    other_key = team_key(client, "other")  # another team: its own (empty) storage
    assert upload(client, Authorization=f"Bearer {other_key}").status_code == 200
    with services_of(client).db.session() as session:
        session.execute(update(Team).where(Team.name == "tests")
                        .values(storage_quota_bytes=10 * len(LINE)))
    assert upload(client).status_code == 200  # the team's own quota, larger than the default


def test_no_quota_when_the_setting_is_zero(fresh_services: Settings) -> None:
    client = api_client(fresh_services.model_copy(update={"storage_quota_bytes": 0}))
    for _ in range(5):
        assert upload(client).status_code == 200


def test_two_uploads_at_once_cannot_both_pass_the_quota(client: FlaskClient) -> None:
    """The check locks the team's row until the upload is recorded: a second check waits for
    it, then counts it."""
    svc = services_of(client)
    settings = svc.settings
    with svc.db.session() as session:
        team_id = session.scalar(select(Team.id).where(Team.name == "tests"))
    outcome: list[BaseException | None] = []

    def second() -> None:
        try:
            with svc.db.session() as session:
                check_quota(session, settings, team_id=team_id, adding=2 * len(LINE))
            outcome.append(None)
        except BlockqError as exc:
            outcome.append(exc)

    with svc.db.session() as session:
        check_quota(session, settings, team_id=team_id, adding=2 * len(LINE))
        thread = threading.Thread(target=second)
        thread.start()
        thread.join(timeout=1)
        assert thread.is_alive(), "the second check did not wait for the first upload"
        session.add(StoredFile(id="file-first", team_id=team_id, purpose="batch",
                               filename="a", size_bytes=2 * len(LINE)))
    thread.join(timeout=20)
    assert len(outcome) == 1 and isinstance(outcome[0], StorageQuotaExceeded)


def test_blockq_teams_create_sets_a_teams_own_quota(fresh_services: Settings,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", fresh_services.resolved_database_url)
    result = CliRunner().invoke(main, ["teams", "create", "small", "--storage-quota", "100",
                                       "--no-key"])
    assert result.exit_code == 0, result.output
    client = api_client(fresh_services, team="small")
    with services_of(client).db.session() as session:
        assert session.scalar(select(Team.storage_quota_bytes).where(Team.name == "small")) == 100
    assert upload(client).status_code == 200  # 76 bytes of 100
    assert error_body(upload(client), 403)["code"] == "storage_quota_exceeded"
