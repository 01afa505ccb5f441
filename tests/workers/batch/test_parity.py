"""Batch API parity with OpenAI's, on the real PostgreSQL and Redis, with the batch workers'
steps called as their tasks call them: a cancelled or expired batch keeps the lines that
completed (its output file holds exactly those), `output_expires_after` sets the files'
`expires_at`, and each terminal status sends OpenAI's webhook event type."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from flask.testing import FlaskClient
from openai.types.webhooks import (
    BatchCancelledWebhookEvent,
    BatchCompletedWebhookEvent,
    BatchExpiredWebhookEvent,
    BatchFailedWebhookEvent,
    UnwrapWebhookEvent,
)
from pydantic import TypeAdapter
from sqlalchemy import select, update

from domain import batches, dispatch, request_store
from domain.models import Batch, BatchStatus, RequestStatus, StoredFile, Team, utcnow
from domain.services import Services
from domain.settings import Settings
from tests.app.flask_client import api_client
from tests.workers.batch.test_pipeline import (
    batch_of,
    chat_line,
    finish,
    make_batch,
    read_jsonl,
    requests_of,
)
from workers.batch.expand import expand
from workers.batch.expiry import expire_due
from workers.batch.finalize import finalize
from workers.batch.release import release
from workers.runtime import Runtime
from workers.webhooks.events import load_event

pytestmark = pytest.mark.services

#: Twelve lines: two refused (a body the endpoint refuses, a line that is no JSON), ten valid.
LINES: list[Any] = [chat_line("c0"), chat_line("c1"), chat_line("bad", temperature=9),
                    chat_line("c3"), chat_line("c4"), "{nope", *(chat_line(f"c{i}")
                                                                for i in range(6, 12))]
REFUSED = [("bad", 400, None), (None, None, "invalid_json_line")]


@pytest.fixture
def rt(fresh_services: Settings) -> Iterator[Runtime]:
    runtime = Runtime(fresh_services.model_copy(update={"max_batch_in_flight": 8}))
    yield runtime
    runtime.db.dispose()


@pytest.fixture
def client(rt: Runtime) -> FlaskClient:
    return api_client(rt.settings, team="acme")  # the team make_batch creates


def _started(rt: Runtime) -> tuple[str, dict[str, str]]:
    """A batch of LINES, expanded and released up to the in-flight limit (8 of its 10 valid
    lines: c0 c1 c3 c4 c6 c7 c8 c9); returns its id and its request ids by custom_id."""
    batch_id = make_batch(rt, LINES)
    expand(rt, batch_id)
    assert len(release(rt).released) == 8
    return batch_id, {r.custom_id: r.id for r in requests_of(rt, batch_id) if r.custom_id}


def _engine_completes(rt: Runtime, request_id: str) -> bool:
    """What an engine worker's completion does (workers.serve.request_records): the guarded
    transition, which a cancel that came first wins."""
    with rt.db.session() as session:
        return request_store.transition(session, request_id, RequestStatus.SUCCEEDED,
                                allowed_from=request_store.ACTIVE_STATUSES, output_text="late",
                                output_tokens=1, finish_reason="stop", finished_at=utcnow())


def _outcome(rt: Runtime, client: FlaskClient, batch_id: str) -> dict[str, Any]:
    """The Batch object the API shows, with the custom_ids of its two files (read through the
    API) and the codes of the error file's lines."""
    body = client.get(f"/v1/batches/{batch_id}").get_json()
    files: dict[str, list[dict[str, Any]]] = {}
    for kind in ("output", "error"):
        content = client.get(f"/v1/files/{body[f'{kind}_file_id']}/content")
        assert content.status_code == 200
        assert read_jsonl(rt, body[f"{kind}_file_id"]) == [
            json.loads(line) for line in content.get_data().splitlines()]
        files[kind] = read_jsonl(rt, body[f"{kind}_file_id"])
    body["output_ids"] = [line["custom_id"] for line in files["output"]]
    body["errors_by_id"] = [(line["custom_id"],
                             line["response"] and line["response"]["status_code"],
                             line["error"] and line["error"]["code"]) for line in files["error"]]
    return body


def test_cancel_keeps_exactly_the_completed_lines(rt: Runtime, client: FlaskClient) -> None:
    batch_id, ids = _started(rt)
    finish(rt, [ids["c0"], ids["c1"]])
    finish(rt, [ids["c3"]], RequestStatus.FAILED)

    cancelling = client.post(f"/v1/batches/{batch_id}/cancel").get_json()
    assert cancelling["status"] == "cancelling"
    assert release(rt).released == []  # nothing more starts
    # c4 was running when the cancel came, and finishes before finalization withdraws it.
    assert _engine_completes(rt, ids["c4"])
    assert finalize(rt, batch_id) is BatchStatus.CANCELLED
    # c6 was running too, and was cancelled: its late completion changes nothing.
    assert not _engine_completes(rt, ids["c6"])
    assert finalize(rt, batch_id) is None

    batch = _outcome(rt, client, batch_id)
    assert batch["status"] == "cancelled" and batch["cancelled_at"] is not None
    assert batch["output_ids"] == ["c0", "c1", "c4"]
    assert batch["errors_by_id"] == [
        REFUSED[0], ("c3", 500, None), REFUSED[1],
        *((f"c{i}", None, "batch_cancelled") for i in range(6, 12))]
    # Every line once, in one file or the other; the counts are the files' counts.
    assert batch["request_counts"] == {"total": 12, "completed": 3, "failed": 3}
    assert batch["usage"]["output_tokens"] == 2 + 2 + 1


def test_expiry_keeps_exactly_the_completed_lines(rt: Runtime, client: FlaskClient) -> None:
    batch_id, ids = _started(rt)
    finish(rt, [ids["c1"], ids["c8"]])
    finish(rt, [ids["c0"]], RequestStatus.FAILED)
    with rt.db.session() as session:
        session.execute(update(Batch).where(Batch.id == batch_id)
                        .values(expires_at=utcnow() - timedelta(seconds=1)))
    assert expire_due(rt) == [batch_id]
    assert _engine_completes(rt, ids["c9"])  # finished in the meantime
    assert finalize(rt, batch_id) is BatchStatus.EXPIRED
    assert not _engine_completes(rt, ids["c3"])

    batch = _outcome(rt, client, batch_id)
    assert batch["status"] == "expired" and batch["expired_at"] is not None
    assert batch["output_ids"] == ["c1", "c8", "c9"]
    assert batch["errors_by_id"] == [
        ("c0", 500, None), *REFUSED[:1], ("c3", None, "batch_expired"),
        ("c4", None, "batch_expired"), *REFUSED[1:],
        *((f"c{i}", None, "batch_expired") for i in (6, 7, 10, 11))]
    assert batch["request_counts"] == {"total": 12, "completed": 3, "failed": 3}


def _files_expiry(rt: Runtime, batch_id: str) -> list[timedelta | None]:
    batch = batch_of(rt, batch_id)
    with rt.db.session() as session:
        rows = session.scalars(select(StoredFile).where(
            StoredFile.id.in_([batch.output_file_id, batch.error_file_id]))).all()
        assert len(rows) == 2
        return [None if row.expires_at is None else row.expires_at - row.created_at
                for row in rows]


def test_output_expires_after_sets_the_files_expiry(rt: Runtime, client: FlaskClient) -> None:
    file_id = client.post("/v1/files", data={
        "purpose": "batch", "file": (io.BytesIO(
            b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": '
            b'{"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}]}}\n'
            b'{"custom_id": "b"}\n'), "in.jsonl")},
        content_type="multipart/form-data").get_json()["id"]
    created = client.post("/v1/batches", json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        "output_expires_after": {"anchor": "created_at", "seconds": 7200}})
    assert created.status_code == 200, created.get_data(as_text=True)
    batch_id = created.get_json()["id"]
    plain = make_batch(rt, [chat_line("x"), "{nope"])
    for each in (batch_id, plain):
        expand(rt, each)
    finish(rt, release(rt).released)
    assert sorted(release(rt).finished) == sorted([batch_id, plain])
    assert finalize(rt, batch_id) is finalize(rt, plain) is BatchStatus.COMPLETED

    assert _files_expiry(rt, batch_id) == [timedelta(seconds=7200)] * 2
    assert _files_expiry(rt, plain) == [None, None]


@pytest.mark.parametrize(("expires_after", "param"), [
    ({"anchor": "created_at", "seconds": 3599}, "output_expires_after.seconds"),
    ({"anchor": "created_at", "seconds": 2_592_001}, "output_expires_after.seconds"),
    ({"anchor": "created_at", "seconds": "7200"}, "output_expires_after.seconds"),
    ({"anchor": "completed_at", "seconds": 7200}, "output_expires_after.anchor"),
    ({"seconds": 7200}, "output_expires_after.anchor"),
    ({"anchor": "created_at", "seconds": 7200, "days": 1}, "output_expires_after.days"),
    ("7200", "output_expires_after"),
])
def test_output_expires_after_is_checked(client: FlaskClient, expires_after: Any,
                                         param: str) -> None:
    response = client.post("/v1/batches", json={
        "input_file_id": "file-whatever", "endpoint": "/v1/chat/completions",
        "completion_window": "24h", "output_expires_after": expires_after})
    assert response.status_code == 400, response.get_data(as_text=True)
    assert response.get_json()["error"]["param"] == param


_EVENT_CLASSES = {
    BatchStatus.COMPLETED: BatchCompletedWebhookEvent,
    BatchStatus.CANCELLED: BatchCancelledWebhookEvent,
    BatchStatus.EXPIRED: BatchExpiredWebhookEvent,
    BatchStatus.FAILED: BatchFailedWebhookEvent,
}


def _end_as(rt: Runtime, status: BatchStatus) -> str:
    """A batch driven to `status` the way the workers drive it."""
    batch_id = make_batch(rt, ["{nope"] if status == BatchStatus.FAILED else [chat_line("a")])
    expand(rt, batch_id)
    if status == BatchStatus.FAILED:
        return batch_id
    if status == BatchStatus.CANCELLED:
        batches.cancel_batch(Services.build(rt.settings), batch_id,
                             team_id=batch_of(rt, batch_id).team_id)
    elif status == BatchStatus.EXPIRED:
        with rt.db.session() as session:
            session.execute(update(Batch).where(Batch.id == batch_id)
                            .values(expires_at=utcnow() - timedelta(seconds=1)))
        expire_due(rt)
    else:
        finish(rt, release(rt).released)
        release(rt)
    assert finalize(rt, batch_id) is status
    return batch_id


@pytest.mark.parametrize("status", list(_EVENT_CLASSES))
def test_each_terminal_status_sends_openais_event(rt: Runtime, status: BatchStatus,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[str, tuple[Any, ...]]] = []
    monkeypatch.setattr(rt.outbox.celery, "send_task",
                        lambda name, args=(), **_: sent.append((name, tuple(args))))
    batch_id = _end_as(rt, status)
    webhooks = [args for name, args in sent if name == dispatch.TASK_WEBHOOK]
    assert webhooks == [(batch_id, f"batch.{status}")]

    with rt.db.session() as session:
        session.execute(update(Team).values(webhook_url="https://hooks.example.com/batches"))
    with rt.db.session() as session:
        event = load_event(session, batch_id, f"batch.{status}")
    assert event is not None
    parsed = TypeAdapter(UnwrapWebhookEvent).validate_python(event.payload)
    assert isinstance(parsed, _EVENT_CLASSES[status]) and parsed.data.id == batch_id
    reached = getattr(batch_of(rt, batch_id), f"{status}_at")
    assert set(event.payload) == {"id", "object", "type", "created_at", "data"}
    assert (parsed.object, parsed.created_at) == ("event", int(reached.timestamp()))
