"""The stream hub: one XREAD for every awaited stream of an API process. A waiter reads its
stream from the first entry, whenever it subscribed; a waiter that subscribes while the hub is
blocked is served without waiting for that block to end; Redis failing reaches every waiter.
Real Redis."""

from __future__ import annotations

import threading

import pytest
import redis

from domain.stream_hub import StreamHub
from domain.streams import StreamWriter, close_stream
from tests.environment import TEST_REDIS_URL, free_port

pytestmark = pytest.mark.services

#: Far longer than any wait below: a waiter served within it was woken, not timed out.
LONG_BLOCK_MS = 120_000


def _first_events(subscription: object, count: int) -> list:
    events = []
    for event in subscription.events(block_ms=20_000):  # type: ignore[attr-defined]
        assert event is not None, "no entry came: the hub did not read this stream"
        events.append(event)
        if len(events) == count:
            return events
    raise AssertionError("unreachable")


def test_waiters_read_their_streams_from_the_start_however_late(
    empty_redis: redis.Redis,
) -> None:
    hub = StreamHub(redis.Redis.from_url(TEST_REDIS_URL), empty_redis, block_ms=LONG_BLOCK_MS)
    writer = StreamWriter(empty_redis, flush_interval_s=0.02)
    writer.follow("req_a", attempt=0)
    writer.add("req_a", "Hello")
    writer.flush()
    early = hub.subscribe("req_a")  # after the first entry: still read from the start
    idle = hub.subscribe("req_idle")  # keeps the hub blocked on another stream
    writer.add("req_a", " world")
    writer.end("req_a", 0, "stop")
    assert [(e.kind, e.value) for e in _first_events(early, 3)] == [
        ("text", "Hello"), ("text", " world"), ("end", "stop")]

    # The hub is now blocked in an XREAD of up to two minutes: a new waiter wakes it. A second
    # waiter of a stream the hub already read gets the whole stream too.
    late = hub.subscribe("req_a")
    assert [e.value for e in _first_events(late, 3)] == ["Hello", " world", "stop"]
    close_stream(empty_redis, "req_b", 1, "refused")
    with hub.subscribe("req_b") as other:
        (event,) = _first_events(other, 1)
        assert (event.kind, event.value, event.attempt) == ("error", "refused", 1)
    for subscription in (early, late, idle):
        subscription.close()
    assert hub.waiting() == 0
    hub.stop()


def _readers(client: redis.Redis) -> int:
    """Connections of this Redis db whose last command is an XREAD (other hubs of this test
    process, left by earlier tests, count too: compare before and after)."""
    db = int(client.connection_pool.connection_kwargs["db"])
    return sum(1 for c in client.client_list() if c["cmd"] == "xread" and int(c["db"]) == db)


def test_many_waiters_share_one_reader(empty_redis: redis.Redis) -> None:
    readers_before = _readers(empty_redis)
    hub = StreamHub(redis.Redis.from_url(TEST_REDIS_URL), empty_redis, block_ms=LONG_BLOCK_MS)
    subscriptions = [hub.subscribe(f"req_{k}") for k in range(50)]
    assert _readers(empty_redis) - readers_before <= 1
    for k in range(50):
        close_stream(empty_redis, f"req_{k}", 0, f"done {k}")
    for k, subscription in enumerate(subscriptions):
        (event,) = _first_events(subscription, 1)
        assert event.value == f"done {k}"
        subscription.close()
    hub.stop()


def test_redis_failing_reaches_every_waiter() -> None:
    down = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
    hub = StreamHub(down, redis.Redis.from_url(TEST_REDIS_URL), block_ms=LONG_BLOCK_MS)
    subscription = hub.subscribe("req_x")  # the wake-up goes through the live client
    failed = threading.Event()

    def wait() -> None:
        try:
            next(iter(subscription.events(block_ms=20_000)))
        except redis.RedisError:
            failed.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    waiter.join(timeout=30)
    assert failed.is_set()
    hub.stop()
