"""The Files and Batch API end to end, with the official `openai` client against the whole local
stack (API, Celery workers, beat, emulated engines; real PostgreSQL and Redis).

One stack serves every test of this module (starting one takes most of a test's time); each
test works as its own team, so none sees another's files or batches.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import openai
import pytest
import redis
from click.testing import CliRunner
from openai import OpenAI
from openai.types import Batch as BatchObject
from openai.types.chat import ChatCompletion
from openai.types.webhooks import (
    BatchCancelledWebhookEvent,
    BatchCompletedWebhookEvent,
    BatchExpiredWebhookEvent,
)
from sqlalchemy import func, select, update

from app.cli import main as cli
from app.cli.stack import Stack
from domain.db import Database
from domain.models import Batch, InferenceRequest, utcnow
from domain.request_store import ACTIVE_STATUSES
from domain.settings import Settings
from domain.teams import create_team, issue_key
from tests.environment import TEST_DATABASE_URL, TEST_REDIS_URL
from tests.stack.webhook_receiver import WebhookReceiver, team_webhook_secret

MODEL = "tiny-llama"
CHAT = "/v1/chat/completions"
MAX_IN_FLIGHT = 32


@pytest.fixture(scope="module")
def stack(
    services_factory: Callable[[Path], Settings], tmp_path_factory: pytest.TempPathFactory,
    inherited_env: dict[str, str],
) -> Iterator[Stack]:
    """The stack `start_stack` starts, with emulated engines 20 times faster than real time,
    a small batch in-flight limit (so that shares matter) and fast batch ticks."""
    settings = services_factory(tmp_path_factory.mktemp("batch-stack")).model_copy(update={
        "num_instances": 2, "log_format": "json", "api_workers": 1, "heartbeat_ttl_s": 2.0,
        "orphan_check_interval_s": 1.0, "webhook_backoff_s": 0.2,
        "engine_kind": "emulated", "emulated_time_scale": 0.05,
        "emulated_output_lengths": "max_tokens", "max_batch_in_flight": MAX_IN_FLIGHT,
        "batch_release_interval_s": 0.2, "batch_expiry_check_interval_s": 0.5,
    })
    running = Stack(settings, env={**inherited_env, **settings.as_env()})
    try:
        running.start()
        running.wait_ready(num_instances=2)
        yield running
    finally:
        running.stop()
        broker = redis.Redis.from_url(TEST_REDIS_URL)
        broker.flushdb()
        broker.close()


@pytest.fixture(scope="module")
def db(stack: Stack) -> Iterator[Database]:
    database = Database(stack.settings.resolved_database_url)
    yield database
    database.dispose()


@pytest.fixture(scope="module")
def receiver() -> Iterator[WebhookReceiver]:
    server = WebhookReceiver()
    yield server
    server.close()


@pytest.fixture
def team_client(stack: Stack, db: Database) -> Callable[..., OpenAI]:
    """An OpenAI client of a new team (with its share and batch webhook URL)."""

    def make(name: str, *, share: int = 1, webhook_url: str | None = None) -> OpenAI:
        with db.session() as session:
            key = issue_key(session, create_team(session, name, share=share,
                                                 webhook_url=webhook_url)).key
        return OpenAI(base_url=f"{stack.api_url}/v1", api_key=key, max_retries=0,
                      _strict_response_validation=True)

    return make


def chat_line(custom_id: str, text: str = "Tell me about queues.", **body: Any
              ) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": MODEL, "messages": [{"role": "user", "content": text}],
                     "max_tokens": 8, **body}}


def jsonl(lines: list[Any]) -> bytes:
    return b"".join((x if isinstance(x, str) else json.dumps(x)).encode() + b"\n"
                    for x in lines)


def start_batch(client: OpenAI, lines: list[Any], **options: Any) -> BatchObject:
    file = client.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch")
    return client.batches.create(input_file_id=file.id, endpoint=CHAT,
                                 completion_window="24h", **options)


def wait_for(client: OpenAI, batch_id: str, done: Callable[[BatchObject], bool],
             timeout_s: float = 120) -> BatchObject:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if done(batch):
            return batch
        assert time.monotonic() < deadline, f"batch {batch_id} stuck: {batch.to_json()}"
        time.sleep(0.05)


def file_lines(client: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def events_of(receiver: WebhookReceiver, batch_id: str, timeout_s: float = 30) -> list[Any]:
    """The batch's events the receiver got, each verified and parsed by the openai client."""
    verifier = OpenAI(api_key="unused", base_url="http://127.0.0.1:9",
                      webhook_secret=team_webhook_secret(TEST_DATABASE_URL, batch_id=batch_id))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with receiver.lock:
            mine = [(h, b) for _, h, b in receiver.deliveries
                    if json.loads(b).get("data", {}).get("id") == batch_id]
        if mine:
            return [verifier.webhooks.unwrap(body, headers) for headers, body in mine]
        time.sleep(0.1)
    return []


def test_files_round_trip(team_client: Callable[..., OpenAI]) -> None:
    client = team_client("files")
    content = jsonl([chat_line("a"), chat_line("b")])
    created = client.files.create(file=("requests.jsonl", content), purpose="batch")
    assert (created.bytes, created.filename, created.purpose) == (len(content),
                                                                  "requests.jsonl", "batch")
    assert client.files.retrieve(created.id) == created
    assert [f.id for f in client.files.list()] == [created.id]
    assert [f.id for f in client.files.list(purpose="batch_output")] == []
    assert client.files.content(created.id).read() == content
    assert client.files.delete(created.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(created.id)
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("x.jsonl", content), purpose="fine-tune")
    assert refused.value.body["param"] == "purpose"  # type: ignore[index]


def test_a_200_line_batch_completes_with_its_files_and_webhook(
    team_client: Callable[..., OpenAI], receiver: WebhookReceiver, db: Database,
) -> None:
    client = team_client("bulk", webhook_url=f"{receiver.url}/ok")
    lines: list[Any] = [chat_line(f"req-{i}", f"Question {i}", max_tokens=4 + i % 5)
                        for i in range(200)]
    bad = {
        10: ("{this is not json", None, "invalid_json_line"),
        20: ({**chat_line("req-20"), "url": "/v1/completions"}, None, "invalid_url"),
        30: (chat_line("req-30", temperature=3), 400, "invalid_value"),
        40: (chat_line("req-40", max_tokens="8"), 400, "invalid_value"),  # a wrong type
        50: (chat_line("req-0", "a duplicate custom_id"), None, "duplicate_custom_id"),
        60: (chat_line("req-60", "word " * 3000), 422, "context_length_exceeded"),
        70: ({**chat_line("req-70"), "method": "GET"}, None, "invalid_method"),
    }
    for index, (line, _, _) in bad.items():
        lines[index] = line
    batch = start_batch(client, lines, metadata={"job": "nightly"})
    assert batch.status == "validating" and batch.metadata == {"job": "nightly"}

    done = wait_for(client, batch.id, lambda b: b.status == "completed")
    assert done.request_counts is not None
    assert done.request_counts.model_dump() == {"total": 200, "completed": 193, "failed": 7}
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    good = [i for i in range(200) if i not in bad]

    output = file_lines(client, done.output_file_id)
    assert [line["custom_id"] for line in output] == [f"req-{i}" for i in good]
    for i, line in zip(good, output, strict=True):
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200
        completion = ChatCompletion.model_validate(line["response"]["body"])
        assert completion.model == MODEL and completion.choices[0].message.content
        assert completion.usage is not None and completion.usage.completion_tokens == 4 + i % 5

    errors = file_lines(client, done.error_file_id)
    expected = [(f"req-{i}" if i not in (10, 50) else (None if i == 10 else "req-0"), status,
                 code) for i, (_, status, code) in bad.items()]
    assert [(e["custom_id"], e["response"] and e["response"]["status_code"],
             (e["error"] or e["response"]["body"]["error"])["code"]) for e in errors] == expected

    outputs = {f.id: f for f in client.files.list(purpose="batch_output")}
    assert set(outputs) == {done.output_file_id, done.error_file_id}
    assert outputs[done.output_file_id].filename == f"{batch.id}_output.jsonl"

    request_id = output[0]["response"]["request_id"]
    with db.session() as session:
        request = session.get(InferenceRequest, request_id)
        assert request is not None
        assert (request.batch_id, request.custom_id, request.batch_line, request.priority,
                request.status) == (batch.id, "req-0", 1, "batch", "succeeded")

    events = events_of(receiver, batch.id)
    assert len(events) == 1 and isinstance(events[0], BatchCompletedWebhookEvent)
    assert events[0].data.id == batch.id and events[0].created_at == done.completed_at


def test_cancel_mid_run_keeps_what_finished(
    team_client: Callable[..., OpenAI], receiver: WebhookReceiver, db: Database,
) -> None:
    client = team_client("canceller", webhook_url=f"{receiver.url}/ok")
    lines = [chat_line(f"c-{i}", max_tokens=128) for i in range(150)]
    batch = start_batch(client, lines,
                        output_expires_after={"anchor": "created_at", "seconds": 3600})
    wait_for(client, batch.id,
             lambda b: b.request_counts is not None and b.request_counts.completed >= 8)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_for(client, batch.id, lambda b: b.status == "cancelled")
    assert done.cancelling_at and done.cancelled_at and done.request_counts is not None
    finished = done.request_counts.completed
    assert 8 <= finished < 150

    output = file_lines(client, done.output_file_id)
    errors = file_lines(client, done.error_file_id)
    assert len(output) == finished and len(errors) == 150 - finished
    assert sorted(line["custom_id"] for line in output + errors) == sorted(
        f"c-{i}" for i in range(150))
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    for file_id in (done.output_file_id, done.error_file_id):  # output_expires_after
        assert file_id is not None
        file = client.files.retrieve(file_id)
        assert file.expires_at == file.created_at + 3600
    with db.session() as session:
        num_requests = session.scalar(select(func.count()).select_from(InferenceRequest)
                                      .where(InferenceRequest.batch_id == batch.id))
        num_active = session.scalar(select(func.count()).select_from(InferenceRequest)
                                    .where(InferenceRequest.batch_id == batch.id,
                                           InferenceRequest.status.in_(ACTIVE_STATUSES)))
    assert num_active == 0
    assert num_requests is not None and num_requests < 150  # unreleased lines never ran
    assert client.batches.cancel(batch.id).status == "cancelled"  # again: a no-op
    events = events_of(receiver, batch.id)
    assert [type(e) for e in events] == [BatchCancelledWebhookEvent]


def test_expiry_moves_unfinished_lines_to_the_error_file(
    team_client: Callable[..., OpenAI], receiver: WebhookReceiver, db: Database,
) -> None:
    client = team_client("late", webhook_url=f"{receiver.url}/ok")
    batch = start_batch(client, [chat_line(f"e-{i}", max_tokens=128) for i in range(120)])
    wait_for(client, batch.id,
             lambda b: b.request_counts is not None and b.request_counts.completed >= 4)
    with db.session() as session:  # the 24 hours have passed
        session.execute(update(Batch).where(Batch.id == batch.id)
                        .values(expires_at=utcnow() - timedelta(seconds=1)))
    done = wait_for(client, batch.id, lambda b: b.status == "expired")
    assert done.expired_at and done.request_counts is not None
    finished = done.request_counts.completed
    assert len(file_lines(client, done.output_file_id)) == finished
    errors = file_lines(client, done.error_file_id)
    assert len(errors) == 120 - finished > 0
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    assert [type(e) for e in events_of(receiver, batch.id)] == [BatchExpiredWebhookEvent]


def test_two_teams_progress_in_proportion_to_their_shares(
    team_client: Callable[..., OpenAI],
) -> None:
    big, small = team_client("big", share=3), team_client("small", share=1)
    content = jsonl([chat_line(f"f-{i}", max_tokens=64) for i in range(120)])
    files = [c.files.create(file=("f.jsonl", content), purpose="batch") for c in (big, small)]
    big_batch, small_batch = (
        c.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        for c, f in zip((big, small), files, strict=True))

    def progress_when_big_has(num_done: int) -> tuple[int, int]:
        done = wait_for(big, big_batch.id, lambda b: b.request_counts is not None
                        and b.request_counts.completed >= num_done)
        counts = small.batches.retrieve(small_batch.id).request_counts
        assert done.request_counts is not None and counts is not None
        return done.request_counts.completed, counts.completed

    # Measured after the start, when both compete for the slots.
    (big_1, small_1), (big_2, small_2) = progress_when_big_has(24), progress_when_big_has(72)
    ratio = (big_2 - big_1) / max(small_2 - small_1, 1)
    print(f"big {big_1}->{big_2}, small {small_1}->{small_2}: ratio {ratio:.2f} (shares 3:1)")
    assert 2.0 <= ratio <= 4.5
    for client, batch in ((big, big_batch), (small, small_batch)):
        wait_for(client, batch.id, lambda b: b.status == "completed")


def test_lists_page_and_teams_see_only_their_own(
    team_client: Callable[..., OpenAI], stack: Stack,
) -> None:
    mine, theirs = team_client("lister"), team_client("outsider")
    file = mine.files.create(file=("tiny.jsonl", jsonl([chat_line("one")])), purpose="batch")
    ids = [mine.batches.create(input_file_id=file.id, endpoint=CHAT,
                               completion_window="24h").id for _ in range(5)]
    first = mine.batches.list(limit=2)
    assert [b.id for b in first.data] == ids[::-1][:2] and first.has_more is True
    second = mine.batches.list(limit=2, after=first.data[-1].id)
    assert [b.id for b in second.data] == ids[::-1][2:4]
    assert [b.id for b in mine.batches.list(limit=2)] == ids[::-1]  # auto-pagination

    assert theirs.batches.list().data == [] and theirs.files.list().data == []
    for call in (lambda: theirs.files.retrieve(file.id), lambda: theirs.files.content(file.id),
                 lambda: theirs.batches.retrieve(ids[0]), lambda: theirs.batches.cancel(ids[0])):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError):  # their file is no input of ours
        theirs.batches.create(input_file_id=file.id, endpoint=CHAT, completion_window="24h")
    for batch_id in ids:
        wait_for(mine, batch_id, lambda b: b.status == "completed")



def test_the_cli_submits_follows_and_downloads_a_batch(
    team_client: Callable[..., OpenAI], tmp_path: Path,
) -> None:
    client = team_client("cli-users")
    lines = [chat_line(f"cli-{i}") for i in range(12)] + ["not json"]
    path = tmp_path / "job.jsonl"
    path.write_bytes(jsonl(lines))
    env = {"BLOCKQ_API_URL": str(client.base_url).rstrip("/"), "BLOCKQ_API_KEY": client.api_key}
    runner = CliRunner()

    submitted = runner.invoke(cli, ["batch", "submit", str(path), "--wait"], env=env)
    assert submitted.exit_code == 0, submitted.output
    batch_id = next(w for w in submitted.output.split() if w.startswith("batch_"))
    assert f"{batch_id}: completed" in submitted.output

    status = runner.invoke(cli, ["batch", "status", batch_id], env=env)
    assert json.loads(status.output)["request_counts"] == {"completed": 12, "failed": 1,
                                                           "total": 13}
    downloaded = runner.invoke(cli, ["batch", "download", batch_id, "--out", str(tmp_path)],
                               env=env)
    assert downloaded.exit_code == 0, downloaded.output
    output = (tmp_path / f"{batch_id}_output.jsonl").read_text().splitlines()
    errors = (tmp_path / f"{batch_id}_errors.jsonl").read_text().splitlines()
    assert len(output) == 12 and len(errors) == 1
    missing = runner.invoke(cli, ["batch", "cancel", "batch_nope"], env=env)
    assert missing.exit_code == 1 and "NotFoundError" in missing.output
