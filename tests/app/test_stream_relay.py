"""The relay of a streamed completion: what one read of the stream hub brought goes out in one
write, its text deltas as one chunk, and the stream's end with its last text. The events are
OpenAI's, whatever the split. No services: the hub's batches and the request's row are given."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from app.api import openai as openai_api
from domain import openai_format as fmt
from domain.models import InferenceRequest, RequestStatus
from domain.streams import StreamEvent

CREATED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


class FakeSubscription:
    def __init__(self, batches: list[list[StreamEvent] | None]) -> None:
        self._batches = batches

    def batches(self, *, block_ms: int = 1000) -> Iterator[list[StreamEvent] | None]:
        yield from self._batches
        raise AssertionError("the relay read past the stream's end")

    def __enter__(self) -> FakeSubscription:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass


class AliveHold:
    def alive(self) -> bool:
        return True


def _request(**columns: Any) -> InferenceRequest:
    return InferenceRequest(id="req_abc", created_at=CREATED, prompt_tokens=3, **columns)


def _relay(batches: list[list[StreamEvent] | None], kind: str, *, include_usage: bool = False,
           keepalive_s: float | None = 15.0) -> openai_api._Relay:
    settings = SimpleNamespace(sync_timeout_s=60.0, sse_keepalive_s=keepalive_s,
                               default_model="tiny-llama")
    svc = SimpleNamespace(settings=settings, streams=SimpleNamespace(
        subscribe=lambda request_id: FakeSubscription(batches)))
    return openai_api._Relay(svc, _request(model="tiny-llama"), kind,  # type: ignore[arg-type]
                             "team", include_usage, AliveHold())  # type: ignore[arg-type]


def _text(value: str, attempt: int = 1) -> StreamEvent:
    return StreamEvent("text", value, attempt)


END = StreamEvent("end", "length", 1)


@pytest.fixture
def finished(monkeypatch: pytest.MonkeyPatch) -> None:
    row = _request(status=RequestStatus.SUCCEEDED, output_text="Hello, world!",
                   finish_reason="length", output_tokens=4, model="tiny-llama")
    monkeypatch.setattr(openai_api, "_terminal_row", lambda svc, request_id: row)


def _payloads(write: str) -> list[Any]:
    events = [part for part in write.split("\n\n") if part]
    assert all(event.startswith("data: ") for event in events), events
    return [event.removeprefix("data: ") for event in events]


@pytest.mark.usefixtures("finished")
def test_what_one_read_brought_goes_out_in_one_write() -> None:
    relay = _relay([[_text("Hel"), _text("lo")], [_text(", "), _text("world"), _text("!"), END]],
                   fmt.KIND_COMPLETION, include_usage=True)
    first, last = list(relay.events())

    (chunk,) = _payloads(first)
    assert json.loads(chunk)["choices"][0]["text"] == "Hello"
    *texts, final, usage, done = _payloads(last)
    assert [json.loads(t)["choices"][0]["text"] for t in texts] == [", world!"]
    assert json.loads(final)["choices"][0]["finish_reason"] == "length"
    assert json.loads(usage)["usage"] == {"prompt_tokens": 3, "completion_tokens": 4,
                                          "total_tokens": 7}
    assert done == "[DONE]"


@pytest.mark.usefixtures("finished")
@pytest.mark.parametrize("kind", [fmt.KIND_COMPLETION, fmt.KIND_CHAT])
@pytest.mark.parametrize("include_usage", [False, True])
def test_a_text_chunk_is_the_event_the_formatter_builds(kind: str, include_usage: bool) -> None:
    text = 'quotes " and \\ and \x00 and é and \n'
    relay = _relay([[_text(text)], [END]], kind, include_usage=include_usage)
    writes = list(relay.events())

    delta: dict[str, Any] | str = {"content": text} if kind == fmt.KIND_CHAT else text
    expected = openai_api._sse(relay._base(delta, None))
    assert expected in writes
    if kind == fmt.KIND_CHAT:
        assert json.loads(_payloads(writes[0])[0])["choices"][0]["delta"] == {
            "role": "assistant", "content": ""}


@pytest.mark.usefixtures("finished")
def test_text_of_another_attempt_ends_the_stream_after_the_text_before_it() -> None:
    relay = _relay([[_text("Hel"), _text("lo"), _text("X", attempt=2)]], fmt.KIND_COMPLETION)
    (write,) = list(relay.events())

    chunk, error = _payloads(write)
    assert json.loads(chunk)["choices"][0]["text"] == "Hello"
    assert json.loads(error)["error"]["code"] == "stream_interrupted"


@pytest.mark.usefixtures("finished")
def test_text_the_stream_lost_is_sent_with_the_end() -> None:
    relay = _relay([[_text("Hello")], None, [END]], fmt.KIND_COMPLETION)
    *_, last = list(relay.events())

    text, final, done = _payloads(last)
    assert json.loads(text)["choices"][0]["text"] == ", world!"
    assert json.loads(final)["choices"][0]["finish_reason"] == "length" and done == "[DONE]"


@pytest.fixture
def finished_late(monkeypatch: pytest.MonkeyPatch) -> None:
    """The request's row is terminal from its third look on (after two quiet spells)."""
    row = _request(status=RequestStatus.SUCCEEDED, output_text="Hello",
                   finish_reason="length", output_tokens=1, model="tiny-llama")
    looks = iter([None, None])
    monkeypatch.setattr(openai_api, "_terminal_row", lambda svc, request_id: next(looks, row))


def _quiet_for_long(keepalive_s: float | None) -> list[str]:
    """The writes of a stream whose first text comes after two quiet spells, each longer than
    a 15 s keep-alive period."""
    relay = _relay([None, None, [_text("Hello"), END]], fmt.KIND_COMPLETION,
                   include_usage=True, keepalive_s=keepalive_s)
    writes = []
    relay.sent_at -= 20  # each quiet spell outlasts the period
    for write in relay.events():
        writes.append(write)
        relay.sent_at -= 20
    return writes


@pytest.mark.usefixtures("finished_late")
def test_by_default_a_waiting_stream_sends_nothing_before_its_first_event() -> None:
    """As vLLM's server: nothing but events (vLLM's benchmark client loses every event after a
    comment that reaches it alone)."""
    writes = _quiet_for_long(None)
    assert all(write.startswith("data: ") for write in writes), writes
    assert json.loads(_payloads(writes[0])[0])["choices"][0]["text"] == "Hello"


@pytest.mark.usefixtures("finished_late")
def test_a_stream_sends_keep_alive_comments_when_a_period_is_set() -> None:
    writes = _quiet_for_long(15.0)
    assert writes[:2] == [": keep-alive\n\n"] * 2
    assert json.loads(_payloads(writes[2])[0])["choices"][0]["text"] == "Hello"


@pytest.mark.vllm
@pytest.mark.usefixtures("finished_late")
@pytest.mark.parametrize("keepalive_s", [None, 15.0])
def test_vllm_benchmark_client_reads_every_event_of_a_default_stream(
        keepalive_s: float | None) -> None:
    """vLLM's `bench serve` client strips each read and keeps what it cannot parse: a comment
    that arrives in a read of its own swallows every later event. The default stream has none;
    one with keep-alives loses its text, as the client did at 256 concurrent streams."""
    from vllm.benchmarks.lib.endpoint_request_func import StreamedResponseHandler

    handler = StreamedResponseHandler()
    messages = [m for write in _quiet_for_long(keepalive_s)  # each write, one read
                for m in handler.add_chunk(write.encode().strip())]
    chunks = [json.loads(m.removeprefix("data: ")) for m in messages if m.startswith("data: {")]
    texts = [chunk["choices"][0]["text"] for chunk in chunks if chunk.get("choices")]
    assert (texts[:1] == ["Hello"]) == (keepalive_s is None), messages
