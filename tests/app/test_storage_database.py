"""Files in the database (BLOCKQ_FILES_STORAGE=database), on the real PostgreSQL: what every host
reads, with the disk store's promises (a file appears whole or not at all, streamed by chunks)."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient
from sqlalchemy import func, select

from app import create_app
from domain import file_bytes
from domain.db import Database
from domain.models import FileChunk
from domain.settings import Settings
from tests.app.flask_client import JSONL, error_body, services_of, team_key, upload

pytestmark = pytest.mark.services


@pytest.fixture
def db(fresh_services: Settings) -> Iterator[Database]:
    database = Database(fresh_services.resolved_database_url)
    yield database
    database.dispose()


def _chunks(db: Database, file_id: str) -> list[int]:
    with db.session() as session:
        return list(session.scalars(select(FileChunk.seq).where(FileChunk.file_id == file_id)
                                    .order_by(FileChunk.seq)))


def test_a_file_round_trips_in_chunks(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_bytes, "COPY_CHUNK_BYTES", 10)
    store = file_bytes.DatabaseFileStore(db)
    content = b"".join(f"line {i}\n".encode() for i in range(7))  # 49 bytes: 5 chunks
    assert store.save("file-a", io.BytesIO(content), max_bytes=100) == len(content)
    assert _chunks(db, "file-a") == [0, 1, 2, 3, 4]
    assert store.size("file-a") == len(content)
    with store.open("file-a") as handle:
        assert handle.readline() == b"line 0\n"
        assert handle.read() == content[len(b"line 0\n"):]
    store.delete("file-a")
    assert _chunks(db, "file-a") == []
    with pytest.raises(FileNotFoundError):
        store.open("file-a")
    with pytest.raises(FileNotFoundError):
        store.size("file-a")


def test_an_empty_file_exists_and_reads_empty(db: Database) -> None:
    store = file_bytes.DatabaseFileStore(db)
    with store.writer("file-empty"):
        pass
    assert store.size("file-empty") == 0
    with store.open("file-empty") as handle:
        assert handle.read() == b""


def test_a_failed_or_too_large_write_leaves_nothing(db: Database,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_bytes, "COPY_CHUNK_BYTES", 4)
    store = file_bytes.DatabaseFileStore(db)
    with pytest.raises(file_bytes.FileTooLarge):
        store.save("file-big", io.BytesIO(b"x" * 30), max_bytes=20)
    assert _chunks(db, "file-big") == []
    with pytest.raises(RuntimeError), store.writer("file-broken") as target:
        target.write(b"y" * 12)  # three chunks inserted, then the writer fails
        raise RuntimeError("writer crashed")
    assert _chunks(db, "file-broken") == []


def test_a_file_deleted_while_read_ends_the_read_with_an_error(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_bytes, "COPY_CHUNK_BYTES", 4)
    store = file_bytes.DatabaseFileStore(db)
    store.save("file-gone", io.BytesIO(b"abcdefghijkl"), max_bytes=100)
    handle = store.open("file-gone")
    assert handle.read(4) == b"abcd"
    store.delete("file-gone")
    with pytest.raises(OSError, match="deleted while it was read"):
        handle.read()


def test_the_files_api_keeps_contents_in_the_database(fresh_services: Settings) -> None:
    settings = fresh_services.model_copy(update={"files_storage": "database"})
    app = create_app(settings)
    app.testing = True
    client: FlaskClient = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {team_key(client, 'tests')}"
    file = upload(client).get_json()
    db = services_of(client).db
    with db.session() as session:
        stored = session.scalar(select(func.count()).select_from(FileChunk)
                                .where(FileChunk.file_id == file["id"]))
    assert stored == 1
    assert not settings.resolved_files_dir.exists() or not any(
        p.name == file["id"] for p in settings.resolved_files_dir.iterdir())
    content = client.get(f"/v1/files/{file['id']}/content")
    assert content.status_code == 200 and content.data == JSONL
    assert client.delete(f"/v1/files/{file['id']}").status_code == 200
    assert _chunks(db, file["id"]) == []
    assert error_body(client.get(f"/v1/files/{file['id']}/content"), 404)["code"] == "not_found"
