"""Hostile batch input on PostgreSQL: a line whose values PostgreSQL refuses (NUL, a lone
surrogate, NaN), nests too deep or is not UTF-8 fails alone, and never holds up another team's
batch; a file with a UTF-8 BOM and CRLF line ends is read as any other."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from sqlalchemy import update

from domain.file_bytes import file_store
from domain.models import BatchLine, BatchStatus, RequestStatus
from domain.settings import Settings
from tests.workers.batch.test_pipeline import (
    CHAT,
    MODEL,
    batch_of,
    chat_line,
    finish,
    lines_of,
    make_batch,
    read_jsonl,
    requests_of,
)
from workers.batch.expand import Expansion, expand
from workers.batch.finalize import finalize
from workers.batch.release import release
from workers.runtime import Runtime

pytestmark = pytest.mark.services

NUL, SURROGATE = "\\u0000", "\\ud800"  # JSON escapes, as they travel in a file


@pytest.fixture
def rt(fresh_services: Settings) -> Iterator[Runtime]:
    runtime = Runtime(fresh_services.model_copy(update={"max_batch_in_flight": 50}))
    yield runtime
    runtime.db.dispose()


def _raw_line(custom_id: str, content: str) -> bytes:
    """A chat line whose message content is `content`, raw JSON text (escapes kept as sent)."""
    return (f'{{"custom_id": "{custom_id}", "method": "POST", "url": "{CHAT}", "body": '
            f'{{"model": "{MODEL}", "max_tokens": 4, "messages": [{{"role": "user", '
            f'"content": {content}}}]}}}}').encode()


def _write(rt: Runtime, batch_id: str, lines: list[bytes], *, end: bytes = b"\n") -> None:
    path = file_store(rt.settings).path(batch_of(rt, batch_id).input_file_id)
    path.write_bytes(b"".join(line + end for line in lines))


def _run_to_the_end(rt: Runtime, *batch_ids: str) -> None:
    """Release and complete every line, then finalize the batches."""
    for _ in range(10):
        release(rt)  # releases what is pending; its finish_done moves finished batches on
        queued = [r.id for b in batch_ids for r in requests_of(rt, b) if r.status == "queued"]
        if not queued:
            break
        finish(rt, queued)
    for batch_id in batch_ids:
        assert batch_of(rt, batch_id).status == "finalizing"
        assert finalize(rt, batch_id) is BatchStatus.COMPLETED


def test_bad_lines_fail_alone_and_the_other_team_completes(rt: Runtime) -> None:
    bad = make_batch(rt, [], team="team-a")
    good = make_batch(rt, [chat_line(f"b{i}") for i in range(3)], team="team-b")
    _write(rt, bad, [
        b"\xef\xbb\xbf" + _raw_line("ok-1", '"Hello"'),  # a BOM before the first line
        _raw_line("nul", f'"Hi{NUL}there"'),
        _raw_line("surrogate", f'"{SURROGATE}"'),
        _raw_line("nan", "NaN"),
        _raw_line("deep", "[" * 100_000 + "]" * 100_000),
        _raw_line("latin-1", '"caf\xe9"').replace(b"\xc3\xa9", b"\xe9"),
        _raw_line(f"id{NUL}", '"Yo"'),  # NUL is text like any other (vLLM takes it)
        _raw_line("ok-2", '"Bye"')[:-2] + b', "metadata": {"x": 1e999}}}',
        _raw_line("ok-3", '"\\ud83d\\ude00"'),  # a surrogate pair is one character: fine
    ], end=b"\r\n")
    assert expand(rt, bad) is Expansion.STARTED and expand(rt, good) is Expansion.STARTED
    verdicts = {line.line: (line.custom_id, line.status, (line.error or {}).get("code"),
                            (line.error or {}).get("param"), (line.error or {}).get("status_code"))
                for line in lines_of(rt, bad)}
    assert verdicts == {
        1: ("ok-1", "pending", None, None, None),
        2: ("nul", "pending", None, None, None),
        3: ("surrogate", "invalid", "invalid_value", "messages.0.content", 400),
        4: ("nan", "invalid", "invalid_value", "messages.0.content", 400),
        5: (None, "invalid", "invalid_json_line", None, None),
        6: (None, "invalid", "invalid_json_line", None, None),
        7: ("id\x00", "pending", None, None, None),
        8: ("ok-2", "invalid", "invalid_value", "metadata.x", 400),
        9: ("ok-3", "pending", None, None, None),
    }
    messages = {line.line: (line.error or {}).get("message", "") for line in lines_of(rt, bad)}
    assert "nested deeper than 64" in messages[5] and "not valid UTF-8" in messages[6]
    assert "lone surrogate (\\ud800)" in messages[3]

    _run_to_the_end(rt, bad, good)
    assert [r.status for r in requests_of(rt, good)] == ["succeeded"] * 3
    passed = ["ok-1", "nul", "id\x00", "ok-3"]
    assert [r.custom_id for r in requests_of(rt, bad)] == passed
    batch = batch_of(rt, bad)
    assert batch.status == "completed"
    assert [line["custom_id"] for line in read_jsonl(rt, batch.output_file_id)] == passed
    assert [r.prompt for r in requests_of(rt, bad)][1].count("Hi\x00there") == 1
    errors = read_jsonl(rt, batch.error_file_id)
    assert len(errors) == 5


def test_a_line_the_database_refuses_at_release_fails_alone(
    rt: Runtime, caplog: pytest.LogCaptureFixture,
) -> None:
    """The bug of issue 13: a pending line the database refused (then NUL, before it was stored
    escaped; here a lone surrogate) made every release round abort, so no team's batch was
    released again. A line holding NUL is released as any other."""
    bad = make_batch(rt, [chat_line(f"a{i}") for i in range(4)], team="team-a")
    good = make_batch(rt, [chat_line(f"b{i}") for i in range(3)], team="team-b")
    assert expand(rt, bad) is expand(rt, good) is Expansion.STARTED
    # NOTE: a json column takes both (as escapes); the text column `prompt` takes NUL only
    # (escaped by domain.models.ExactText).
    poisoned = {2: {"prompt": "Hi\x00there"}, 3: {"prompt": "\ud800"}}
    with rt.db.session() as session:
        for number, change in poisoned.items():
            fields = next(line.fields for line in lines_of(rt, bad) if line.line == number)
            session.execute(update(BatchLine)
                            .where(BatchLine.batch_id == bad, BatchLine.line == number)
                            .values(fields={**(fields or {}), **change}))

    with caplog.at_level(logging.WARNING, logger="workers.batch.release"):
        first = release(rt)
    assert len(first.released) == 6  # team B's 3 lines and team A's 3 good ones
    assert [r.custom_id for r in requests_of(rt, good)] == ["b0", "b1", "b2"]
    assert [r.custom_id for r in requests_of(rt, bad)] == ["a0", "a1", "a3"]
    assert requests_of(rt, bad)[1].prompt == "Hi\x00there"
    failed = {line.line: line.error for line in lines_of(rt, bad) if line.status == "invalid"}
    assert set(failed) == {3}
    assert {(e or {}).get("code") for e in failed.values()} == {"line_refused"}
    refusals = [r for r in caplog.records if "cannot be released and fails" in r.getMessage()]
    assert len(refusals) == 1  # the bad line logged once

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="workers.batch.release"):
        assert release(rt).released == []  # nothing pending: no new failure, no new log
    assert caplog.records == []
    _run_to_the_end(rt, bad, good)
    assert batch_of(rt, good).status == batch_of(rt, bad).status == "completed"
    errors = read_jsonl(rt, batch_of(rt, bad).error_file_id)
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [("a2", 500)]
    assert json.dumps(errors).count("line_refused") == 1
    assert {r.status for r in requests_of(rt, bad)} == {RequestStatus.SUCCEEDED}
