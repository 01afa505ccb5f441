"""Output streams in the real Redis: entries reach a request's stream in the order they were
written, so a reader that stops at the end entry has read all the text."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from domain.streams import RETAIN_S, StreamEvent, StreamWriter, read_stream

pytestmark = pytest.mark.services


class SlowFlushRedis:
    """The real client, whose pipelines stall before executing on the thread named `slow`: the
    moment between a flush taking text out of the buffer and writing it to Redis, stretched."""

    def __init__(self, client: redis.Redis, stall_s: float) -> None:
        self.client, self.stall_s = client, stall_s
        self.flush_taken = threading.Event()

    def pipeline(self, **kwargs: Any) -> Any:
        pipe = self.client.pipeline(**kwargs)
        if threading.current_thread().name == "slow":
            execute = pipe.execute

            def stalled_execute() -> Any:
                self.flush_taken.set()
                time.sleep(self.stall_s)
                return execute()

            pipe.execute = stalled_execute
        return pipe


@pytest.fixture
def client(empty_redis: redis.Redis) -> redis.Redis:
    return empty_redis


def read_until_end(client: redis.Redis, request_id: str) -> list[StreamEvent]:
    events: list[StreamEvent] = []
    for event in read_stream(client, request_id, block_ms=100):
        assert event is not None, f"no end entry; read so far: {events}"
        events.append(event)
        if event.kind != "text":
            return events
    raise AssertionError("unreachable")


def test_the_end_entry_never_overtakes_text_a_flush_has_taken(client: redis.Redis) -> None:
    slow = SlowFlushRedis(client, stall_s=0.3)
    writer = StreamWriter(slow, flush_interval_s=0.02)  # type: ignore[arg-type] - the proxy forwards what it uses
    writer.follow("req_1", attempt=1)
    writer.add("req_1", "the whole ")
    writer.add("req_1", "answer")
    flusher = threading.Thread(target=writer.flush, name="slow")
    flusher.start()
    assert slow.flush_taken.wait(5)
    writer.end("req_1", 1, "stop")  # while the flush holds the text, not yet in Redis
    flusher.join()

    events = read_until_end(client, "req_1")
    assert [e.kind for e in events] == ["text", "end"]
    assert "".join(e.value for e in events if e.kind == "text") == "the whole answer"


def test_text_added_while_the_end_is_written_is_not_lost_before_it(client: redis.Redis) -> None:
    """Many small deltas, a background flusher every millisecond, and the end: every delta
    added before `end` is in the stream before the end entry."""
    writer = StreamWriter(client, flush_interval_s=0.001)
    writer.start()
    try:
        for i in range(20):
            request_id = f"req_{i}"
            writer.follow(request_id, attempt=1)
            deltas = [f"{i}.{k} " for k in range(200)]
            for delta in deltas:
                writer.add(request_id, delta)
            writer.end(request_id, 1, "length")
            events = read_until_end(client, request_id)
            assert events[-1].kind == "end"
            assert "".join(e.value for e in events[:-1]) == "".join(deltas)
    finally:
        writer.stop()


def test_a_first_token_is_written_at_once_and_later_ones_together(client: redis.Redis) -> None:
    """The writer's interval (here far longer than the test) holds back no request's first
    text; what follows it waits for the interval, every request's in one write."""
    writer = StreamWriter(client, flush_interval_s=60)
    writer.start()
    try:
        writer.follow("req_1", attempt=1)
        writer.add("req_1", "first")
        first = next(read_stream(client, "req_1", block_ms=10_000))
        assert first == StreamEvent("text", "first", 1)
        assert 0 < client.ttl("blockq:stream:req_1") <= RETAIN_S  # kept a while, not forever
        writer.add("req_1", " second")
        assert client.xlen("blockq:stream:req_1") == 1  # waits for the interval (or the end)
        writer.end("req_1", 1, "stop")
        events = read_until_end(client, "req_1")
        assert [e.value for e in events] == ["first", " second", "stop"]
    finally:
        writer.stop()
