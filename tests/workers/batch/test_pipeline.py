"""The batch workers' steps against the real PostgreSQL and Redis, without Celery: expansion,
release, finalization, cancel and expiry, called as the tasks call them."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from domain import batches
from domain.batches import BATCH_WINDOW_KEY
from domain.file_bytes import file_store
from domain.file_records import new_file_id, register_file
from domain.models import (
    Batch,
    BatchLine,
    BatchStatus,
    InferenceRequest,
    LineStatus,
    RequestStatus,
    StoredFile,
    Team,
    utcnow,
)
from domain.services import Services
from domain.settings import Settings
from domain.teams import create_team
from tests.engine_states import engine_state
from tests.workers.request_rows import new_request
from workers.batch.expand import Expansion, expand
from workers.batch.expiry import expire_due
from workers.batch.finalize import finalize
from workers.batch.headroom_window import batch_window
from workers.batch.release import release
from workers.runtime import Runtime

pytestmark = pytest.mark.services

CHAT = "/v1/chat/completions"
MODEL = "tiny-llama"


@pytest.fixture
def rt(fresh_services: Settings) -> Iterator[Runtime]:
    runtime = Runtime(fresh_services.model_copy(update={"max_batch_in_flight": 8}))
    yield runtime
    runtime.db.dispose()


def chat_line(custom_id: str, text: str = "Hello", **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": MODEL, "messages": [{"role": "user", "content": text}],
                     "max_tokens": 8, **body}}


def make_batch(rt: Runtime, lines: list[Any], *, team: str = "acme", share: int = 1,
               endpoint: str = CHAT) -> str:
    """A team (created if new), an uploaded input file of `lines` (str: verbatim, else JSON),
    and a validating batch on it."""
    content = b"".join((x if isinstance(x, str) else json.dumps(x)).encode() + b"\n"
                       for x in lines)
    file_id = new_file_id()
    file_store(rt.settings).path(file_id).write_bytes(content)
    with rt.db.session() as session:
        found = session.scalar(select(Team).where(Team.name == team))
        team_id = (found or create_team(session, team, share=share)).id
        register_file(session, file_id=file_id, team_id=team_id, purpose="batch",
                      filename="in.jsonl", size_bytes=len(content))
        batch = Batch(id=batches.new_batch_id(), team_id=team_id, endpoint=endpoint,
                      input_file_id=file_id, completion_window="24h",
                      expires_at=utcnow() + timedelta(hours=24))
        session.add(batch)
    return batch.id


def lines_of(rt: Runtime, batch_id: str) -> list[BatchLine]:
    with rt.db.session() as session:
        return list(session.scalars(select(BatchLine).where(BatchLine.batch_id == batch_id)
                                    .order_by(BatchLine.line)))


def batch_of(rt: Runtime, batch_id: str) -> Batch:
    with rt.db.session() as session:
        batch = session.get(Batch, batch_id)
        assert batch is not None
        return batch


def requests_of(rt: Runtime, batch_id: str) -> list[InferenceRequest]:
    with rt.db.session() as session:
        return list(session.scalars(select(InferenceRequest)
                                    .where(InferenceRequest.batch_id == batch_id)
                                    .order_by(InferenceRequest.batch_line)))


def finish(rt: Runtime, request_ids: list[str], status: RequestStatus = RequestStatus.SUCCEEDED
           ) -> None:
    """What an engine worker writes when it completes a request."""
    values: dict[str, Any] = {"status": status, "finished_at": utcnow()}
    if status == RequestStatus.SUCCEEDED:
        values.update(output_text="tok tok", output_tokens=2, finish_reason="stop")
    else:
        values.update(error={"type": "engine_error", "message": "boom"})
    with rt.db.session() as session:
        session.execute(update(InferenceRequest).where(InferenceRequest.id.in_(request_ids))
                        .values(**values))


def read_jsonl(rt: Runtime, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(line) for line in
            file_store(rt.settings).path(file_id).read_text().splitlines()]


def test_expansion_checks_each_line_and_keeps_lines_out_of_requests(rt: Runtime) -> None:
    batch_id = make_batch(rt, [
        chat_line("ok-1"),
        "{not json",
        {**chat_line("get"), "method": "GET"},
        {**chat_line("wrong-url"), "url": "/v1/completions"},
        chat_line("hot", temperature=5),
        chat_line("other-model", model="gpt-4o"),
        chat_line("ok-1", "a duplicate"),
        chat_line("long", "word " * 3000),
        "",
        {"method": "POST", "url": CHAT, "body": {}},
        chat_line("streamed", stream=True),
        chat_line("ok-2", max_completion_tokens=4, max_tokens=None),
    ])
    assert expand(rt, batch_id) is Expansion.STARTED
    batch = batch_of(rt, batch_id)
    assert (batch.status, batch.num_lines, batch.model) == ("in_progress", 11, MODEL)
    lines = lines_of(rt, batch_id)
    assert [line.line for line in lines] == [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12]
    verdicts = {line.line: (line.status, (line.error or {}).get("code"),
                            (line.error or {}).get("status_code")) for line in lines}
    assert verdicts == {
        1: ("pending", None, None),
        2: ("invalid", "invalid_json_line", None),
        3: ("invalid", "invalid_method", None),
        4: ("invalid", "invalid_url", None),
        5: ("invalid", "invalid_value", 400),
        6: ("invalid", "model_not_found", 404),
        7: ("invalid", "duplicate_custom_id", None),
        8: ("invalid", "context_length_exceeded", 422),
        10: ("invalid", "missing_required_parameter", None),
        11: ("invalid", "invalid_value", 400),
        12: ("pending", None, None),
    }
    assert lines[0].fields is not None and lines[0].fields["priority"] == "batch"
    assert lines[-1].fields is not None and lines[-1].fields["max_tokens"] == 4
    # Nothing is a request yet: the orphan sweep, which re-enqueues stale queued requests,
    # cannot start a line the releaser holds back.
    assert requests_of(rt, batch_id) == []


def test_release_keeps_the_in_flight_limit_and_shares_it_by_team(rt: Runtime) -> None:
    big = make_batch(rt, [chat_line(f"b{i}") for i in range(20)], team="big", share=3)
    small = make_batch(rt, [chat_line(f"s{i}") for i in range(20)], team="small", share=1)
    assert expand(rt, big) is expand(rt, small) is Expansion.STARTED

    first = release(rt)
    assert len(first.released) == 8  # max_batch_in_flight
    assert (len(requests_of(rt, big)), len(requests_of(rt, small))) == (6, 2)
    request = requests_of(rt, big)[0]
    assert (request.status, request.priority, request.custom_id, request.batch_line,
            request.id) == ("queued", "batch", "b0", 1, lines_of(rt, big)[0].request_id)
    assert [line.status for line in lines_of(rt, big)][:7] == ["released"] * 6 + ["pending"]
    assert release(rt).released == []  # no slot is free

    finish(rt, [r.id for r in requests_of(rt, big)[:3]])
    again = release(rt)
    # big has 3 in flight (1 per share), small 2 (2 per share): the 3 free slots go to big.
    assert len(again.released) == 3 and len(requests_of(rt, big)) == 9
    assert {r.batch_line for r in requests_of(rt, big)} == set(range(1, 10))  # in file order


def test_a_finished_batch_gets_its_files_in_input_order(rt: Runtime) -> None:
    batch_id = make_batch(rt, [chat_line("a"), chat_line("bad", temperature=9), "[1, 2]",
                               chat_line("b"), chat_line("c")])
    expand(rt, batch_id)
    ids = release(rt).released
    assert len(ids) == 3
    finish(rt, ids[:2])
    finish(rt, ids[2:], RequestStatus.FAILED)
    assert release(rt).finished == [batch_id]
    assert finalize(rt, batch_id) is BatchStatus.COMPLETED
    assert finalize(rt, batch_id) is None  # a redelivery changes nothing

    batch = batch_of(rt, batch_id)
    assert batch.status == "completed" and batch.completed_at is not None
    output, errors = read_jsonl(rt, batch.output_file_id), read_jsonl(rt, batch.error_file_id)
    assert [line["custom_id"] for line in output] == ["a", "b"]
    assert all(line["id"].startswith("batch_req_") and line["error"] is None for line in output)
    body = output[0]["response"]["body"]
    assert output[0]["response"]["status_code"] == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == "tok tok" and body["model"] == MODEL
    assert [(e["custom_id"], e["response"] and e["response"]["status_code"],
             e["error"] and e["error"]["code"]) for e in errors] == [
        ("bad", 400, None), (None, None, "invalid_json_line"), ("c", 500, None)]
    assert errors[0]["response"]["body"]["error"]["param"] == "temperature"
    with rt.db.session() as session:
        counts = batches.line_counts(session, [batch_id])[batch_id]
        purposes = session.scalars(select(StoredFile.purpose)
                                   .where(StoredFile.id.in_([batch.output_file_id,
                                                             batch.error_file_id]))).all()
    assert (counts.completed, counts.failed) == (2, 3)
    assert purposes == ["batch_output", "batch_output"]


def test_cancel_withdraws_unreleased_lines_and_cancels_requests_in_flight(
    rt: Runtime,
) -> None:
    batch_id = make_batch(rt, [chat_line(f"c{i}") for i in range(12)])
    expand(rt, batch_id)
    released = release(rt).released
    finish(rt, released[:3])
    services = Services.build(rt.settings)
    team_id = batch_of(rt, batch_id).team_id
    batches.cancel_batch(services, batch_id, team_id=team_id)
    assert release(rt).released == []  # a cancelling batch releases nothing more

    assert finalize(rt, batch_id) is BatchStatus.CANCELLED
    batch = batch_of(rt, batch_id)
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    requests = requests_of(rt, batch_id)
    assert [r.status for r in requests] == ["succeeded"] * 3 + ["cancelled"] * 5
    assert rt.fleet.cancelled(r.id for r in requests) == {r.id for r in requests[3:]}
    assert {line.status for line in lines_of(rt, batch_id)[8:]} == {"cancelled"}
    output, errors = read_jsonl(rt, batch.output_file_id), read_jsonl(rt, batch.error_file_id)
    assert [line["custom_id"] for line in output] == ["c0", "c1", "c2"]
    assert [line["custom_id"] for line in errors] == [f"c{i}" for i in range(3, 12)]
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}


def test_a_batch_cancelled_while_validating_ends_without_files(rt: Runtime) -> None:
    batch_id = make_batch(rt, [chat_line("x")])
    batches.cancel_batch(Services.build(rt.settings), batch_id,
                         team_id=batch_of(rt, batch_id).team_id)
    assert expand(rt, batch_id) is Expansion.SKIPPED
    assert finalize(rt, batch_id) is BatchStatus.CANCELLED
    batch = batch_of(rt, batch_id)
    assert (batch.status, batch.output_file_id, batch.error_file_id) == ("cancelled", None, None)
    assert lines_of(rt, batch_id) == []


def test_expiry_sends_unfinished_lines_to_the_error_file(rt: Runtime) -> None:
    batch_id = make_batch(rt, [chat_line(f"e{i}") for i in range(10)])
    expand(rt, batch_id)
    finish(rt, release(rt).released[:1])
    assert expire_due(rt) == []
    with rt.db.session() as session:
        session.execute(update(Batch).where(Batch.id == batch_id)
                        .values(expires_at=utcnow() - timedelta(seconds=1)))
    assert expire_due(rt) == [batch_id]
    assert batch_of(rt, batch_id).status == "finalizing"
    assert finalize(rt, batch_id) is BatchStatus.EXPIRED
    batch = batch_of(rt, batch_id)
    assert batch.status == "expired" and batch.expired_at is not None
    assert [line["custom_id"] for line in read_jsonl(rt, batch.output_file_id)] == ["e0"]
    errors = read_jsonl(rt, batch.error_file_id)
    assert len(errors) == 9 and {e["error"]["code"] for e in errors} == {"batch_expired"}


@pytest.mark.parametrize(("content", "code", "line"), [
    ([], "empty_file", None),
    (["", "   "], "empty_file", None),
    (["{nope", "[]"], "invalid_json_line", 1),
    ([chat_line(f"t{i}") for i in range(4)], "too_many_lines", 4),
])
def test_a_file_that_fails_the_batch(rt: Runtime, content: list[Any], code: str,
                                     line: int | None) -> None:
    rt.settings = rt.settings.model_copy(update={"max_batch_lines": 3})
    batch_id = make_batch(rt, content)
    assert expand(rt, batch_id) is Expansion.FAILED
    batch = batch_of(rt, batch_id)
    assert batch.status == "failed" and batch.failed_at is not None
    assert batch.errors is not None and (batch.errors[0]["code"], batch.errors[0]["line"]) == (
        code, line)
    assert lines_of(rt, batch_id) == []


def test_a_missing_input_file_fails_the_batch(rt: Runtime) -> None:
    batch_id = make_batch(rt, [chat_line("x")])
    file_store(rt.settings).delete(batch_of(rt, batch_id).input_file_id)
    assert expand(rt, batch_id) is Expansion.FAILED
    assert batch_of(rt, batch_id).errors == [{
        "code": "file_not_found", "param": "input_file_id", "line": None,
        "message": f"The input file {batch_of(rt, batch_id).input_file_id} no longer exists."}]


@pytest.mark.slow
def test_50000_lines_are_expanded_in_bounded_memory(rt: Runtime) -> None:
    prompt = "Summarise the state of the queue and what each worker is doing now. " * 4
    line = {"custom_id": "", "method": "POST", "url": "/v1/completions",
            "body": {"model": MODEL, "prompt": prompt, "max_tokens": 4}}
    batch_id = make_batch(rt, [], endpoint="/v1/completions")
    path = file_store(rt.settings).path(batch_of(rt, batch_id).input_file_id)
    with path.open("w") as handle:
        for i in range(50_000):
            handle.write(json.dumps({**line, "custom_id": f"q{i}"}) + "\n")
    rt.prompts.warm_up()  # the tokenizer is loaded once per process, not per batch
    tracemalloc.start()
    try:
        assert expand(rt, batch_id) is Expansion.STARTED
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    with rt.db.session() as session:
        pending = session.scalar(select(func.count()).select_from(BatchLine)
                                 .where(BatchLine.batch_id == batch_id,
                                        BatchLine.status == LineStatus.PENDING))
    assert batch_of(rt, batch_id).num_lines == pending == 50_000
    file_mib, peak_mib = path.stat().st_size / 2**20, peak_bytes / 2**20
    print(f"50,000 lines: {file_mib:.1f} MiB file, peak traced memory {peak_mib:.1f} MiB")
    assert peak_mib < file_mib / 2  # never the whole file (nor all its rows) at once
    assert len(release(rt).released) == 8


def _interactive_done(rt: Runtime, ttft_s: float, finished_ago_s: float = 0.0,
                      engine_s: float = 1.0) -> None:
    """An interactive request that finished `finished_ago_s` ago after a TTFT of `ttft_s`,
    `engine_s` after its engine started it."""
    finished = utcnow() - timedelta(seconds=finished_ago_s)
    created = finished - timedelta(seconds=max(ttft_s + 1.0, engine_s))
    with rt.db.session() as session:
        request_id = new_request(session)
        session.execute(update(InferenceRequest).where(InferenceRequest.id == request_id).values(
            status=RequestStatus.SUCCEEDED, created_at=created, updated_at=finished,
            started_at=finished - timedelta(seconds=engine_s),
            first_token_at=created + timedelta(seconds=ttft_s), finished_at=finished))


def test_the_batch_window_yields_to_interactive_traffic_and_grows_back(rt: Runtime) -> None:
    rt = Runtime(rt.settings.model_copy(update={
        "batch_headroom_ttft_s": 1.0, "batch_headroom_min_window": 2,
        "batch_headroom_increase": 2.0, "batch_headroom_window_s": 30.0}))
    batch_id = make_batch(rt, [chat_line(f"l{i}") for i in range(20)])
    expand(rt, batch_id)
    # Nothing interactive: the window starts at its minimum and grows by 2 a round.
    assert len(release(rt).released) == 4
    assert len(release(rt).released) == 2  # window 6
    # An interactive request misses its 1 s target: the window halves (6 -> 3), nothing new.
    _interactive_done(rt, ttft_s=3.0)
    assert release(rt).released == []
    finish(rt, [r.id for r in requests_of(rt, batch_id)])
    assert len(release(rt).released) == 2  # halved again, to its minimum
    # The miss ages out of the window: growth resumes (2 -> 4), on time requests keep it going.
    with rt.db.session() as session:
        session.execute(update(InferenceRequest)
                        .where(InferenceRequest.priority == "interactive")
                        .values(updated_at=utcnow() - timedelta(seconds=60),
                                finished_at=utcnow() - timedelta(seconds=60)))
    _interactive_done(rt, ttft_s=0.2)
    assert len(release(rt).released) == 2
    assert json.loads(rt.redis.get(BATCH_WINDOW_KEY))["window"] == 4.0


def test_a_growing_engine_queue_shrinks_the_batch_window(rt: Runtime) -> None:
    rt = Runtime(rt.settings.model_copy(update={
        "batch_headroom_ttft_s": 1.0, "batch_headroom_min_window": 1,
        "batch_headroom_increase": 4.0}))
    rt.redis.set(BATCH_WINDOW_KEY, json.dumps({"window": 8.0, "num_waiting": 0}))
    rt.fleet.publish("gpu.0", engine_state(num_waiting=5))
    assert batch_window(rt) == 4
    assert batch_window(rt) == 8  # still 5 waiting, but no longer growing
    rt.fleet.publish("gpu.0", engine_state(num_waiting=9))
    assert batch_window(rt) == 4
    # Off (target 0): the fixed cap, whatever the queue.
    assert batch_window(Runtime(rt.settings.model_copy(
        update={"batch_headroom_ttft_s": 0.0}))) == rt.settings.max_batch_in_flight


def test_the_batch_window_leaves_the_engine_slots_interactive_traffic_needs(rt: Runtime) -> None:
    rt = Runtime(rt.settings.model_copy(update={
        "batch_headroom_ttft_s": 1.0, "batch_headroom_min_window": 2,
        "batch_headroom_increase": 100.0, "batch_headroom_window_s": 10.0,
        "batch_headroom_slot_margin": 2.0, "max_batch_in_flight": 256}))

    def window() -> int:
        for name in ("gpu.0", "gpu.1"):  # fresh heartbeats: two live engines, 16 slots each
            rt.fleet.publish(name, engine_state(max_num_seqs=16))
        return batch_window(rt)

    # No interactive traffic: every slot of the two engines, whatever the window's growth.
    assert window() == 32
    # Interactive requests on time but 40 engine-seconds in the last 10 s: 4 at once on
    # average, so 4 + 2 x sqrt(4) = 8 slots stay theirs.
    for _ in range(4):
        _interactive_done(rt, ttft_s=0.2, engine_s=10.0)
    assert window() == 24
    assert json.loads(rt.redis.get(BATCH_WINDOW_KEY))["slot_bound"] == 24
    # So busy that nothing is left: the window's minimum still runs.
    for _ in range(30):
        _interactive_done(rt, ttft_s=0.2, engine_s=10.0)
    assert window() == 2
    # A negative margin turns the bound off: the window alone (it stepped from 2).
    rt = Runtime(rt.settings.model_copy(update={"batch_headroom_slot_margin": -1.0}))
    assert window() == 102
