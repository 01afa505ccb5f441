"""One reader of every output stream an API process waits on.

A held completion (sync or streamed) waits for its request's Redis stream (`domain.streams`). Read
one by one, each waiter holds a Redis connection in a blocking XREAD for as long as it waits:
2,000 open streams are 2,000 Redis connections per API process. The hub reads them all with one
XREAD on one connection and hands each entry to the waiters of its stream, through a queue of
their own: a waiter costs a queue, not a connection or a thread.

A new waiter must not wait for the hub's current XREAD to time out before its stream is read:
the hub's XREAD always includes a wake-up stream of its own, and `subscribe` adds an entry to
it. If the hub is blocked, the entry ends its XREAD at once; if it is between two XREADs, the
next one returns at once (the entry is newer than the last one it read). Either way the new
stream is read from its first entry, with no window in which an entry could be missed.

Under gunicorn's gevent worker the hub's thread is a greenlet (threading is patched before the
app is loaded); under threads (tests, the development server) it is a thread. The code is the
same.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Iterator

import redis

from domain.streams import StreamEvent, parse_event, stream_key

__all__ = ["StreamHub", "Subscription"]

logger = logging.getLogger(__name__)

#: The longest XREAD of the hub (a blocked read also ends when a waiter subscribes).
HUB_BLOCK_MS = 5_000
#: Entries read per stream per XREAD.
READ_COUNT = 256
#: After an XREAD that returned entries, how long the hub lets more arrive before the next one.
#: An engine worker writes the text of all its streams in one pipeline every 20 ms; the first
#: XADD of it wakes the hub's XREAD at once, and without this pause a second XREAD (as long as
#: the first: one key per awaited stream) would follow for the rest of the same pipeline.
COALESCE_S = 0.002
#: How long the hub waits before reading again after Redis failed it.
RETRY_AFTER_ERROR_S = 0.5
#: A wake-up stream lives this long after its last use (a dead process leaves nothing behind).
WAKE_TTL_S = 60


class _Failed:
    """Put in a waiter's queue when the hub cannot read Redis: the waiter falls back to its
    row (the request was accepted; its answer comes from PostgreSQL)."""

    def __init__(self, error: redis.RedisError) -> None:
        self.error = error


class Subscription:
    """One waiter on one request's stream: its events in order, from the stream's start."""

    def __init__(self, hub: StreamHub, key: str) -> None:
        self.hub, self.key = hub, key
        self.queue: queue.Queue[list[StreamEvent] | _Failed] = queue.Queue()

    def events(self, *, block_ms: int = 1000) -> Iterator[StreamEvent | None]:
        """The stream's events as they come; None after each `block_ms` without news (the caller
        checks its row, deadline and client). Raises the hub's RedisError when Redis fails."""
        for batch in self.batches(block_ms=block_ms):
            if batch is None:
                yield None
            else:
                yield from batch

    def batches(self, *, block_ms: int = 1000) -> Iterator[list[StreamEvent] | None]:
        """The stream's events as the hub read them: each batch is the entries one read found
        (at least one, in order); None after each `block_ms` without news. Raises the hub's
        RedisError when Redis fails."""
        while True:
            try:
                batch = self.queue.get(timeout=block_ms / 1000)
            except queue.Empty:
                yield None
                continue
            if isinstance(batch, _Failed):
                raise batch.error
            yield batch

    def close(self) -> None:
        self.hub.unsubscribe(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class StreamHub:
    """The process's reader of awaited streams (see the module docstring)."""

    def __init__(self, reader: redis.Redis, waker: redis.Redis, *,
                 block_ms: int = HUB_BLOCK_MS) -> None:
        """`reader`: a client for the hub's blocking XREAD alone (it holds a connection for as
        long as it blocks); `waker`: the process's shared client, for subscribe's wake-ups."""
        self.redis, self.waker = reader, waker
        self.block_ms = block_ms
        self.wake_key = f"blockq:stream-hub:{uuid.uuid4().hex}"
        self._lock = threading.Lock()
        self._waiters: dict[str, set[Subscription]] = {}
        self._last_ids: dict[str, bytes | str] = {}
        # NOTE: "0-0", not "$": a wake-up added before the hub's first XREAD is still seen.
        self._wake_last: bytes | str = "0-0"
        self._thread: threading.Thread | None = None
        self._stopped = False

    def subscribe(self, request_id: str) -> Subscription:
        """Start waiting on a request's stream (its entries from the first one). Raises
        RedisError when Redis cannot be reached."""
        subscription = Subscription(self, stream_key(request_id))
        with self._lock:
            last_id = self._last_ids.get(subscription.key)
            if last_id is not None and last_id != "0-0":
                # NOTE: another waiter of this stream was handed its entries up to last_id: this
                # one reads them itself, under the lock, so that the hub's next entries come
                # after them in its queue.
                backlog = self.waker.xrange(subscription.key, "-", last_id)
                if backlog:
                    subscription.queue.put([parse_event(fields) for _, fields in backlog])
            self._waiters.setdefault(subscription.key, set()).add(subscription)
            self._last_ids.setdefault(subscription.key, "0-0")
            self._start_locked()
        try:
            self._wake()
        except redis.RedisError:
            self.unsubscribe(subscription)
            raise
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            waiters = self._waiters.get(subscription.key)
            if waiters is None:
                return
            waiters.discard(subscription)
            if not waiters:
                del self._waiters[subscription.key]
                del self._last_ids[subscription.key]

    def waiting(self) -> int:
        """Streams waited on now."""
        with self._lock:
            return len(self._waiters)

    def stop(self) -> None:
        self._stopped = True
        try:
            self._wake()
        except redis.RedisError:
            pass

    def _wake(self) -> None:
        with self.waker.pipeline(transaction=False) as pipe:
            pipe.xadd(self.wake_key, {"w": 1}, maxlen=1, approximate=False)
            pipe.expire(self.wake_key, WAKE_TTL_S)
            pipe.execute()

    def _start_locked(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="stream-hub", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stopped:
            with self._lock:
                streams: dict[str, bytes | str] = dict(self._last_ids)
            streams[self.wake_key] = self._wake_last
            try:
                reply = self.redis.xread(streams, block=self.block_ms, count=READ_COUNT)
            except redis.RedisError as exc:
                self._fail_all(exc)
                time.sleep(RETRY_AFTER_ERROR_S)
                continue
            except Exception:  # noqa: BLE001 - the hub must outlive any one bad reply
                logger.exception("stream hub: unexpected error; reading again")
                time.sleep(RETRY_AFTER_ERROR_S)
                continue
            if reply:
                self._dispatch(reply, streams)
                time.sleep(COALESCE_S)

    def _dispatch(self, reply: list, read_from: dict[str, bytes | str]) -> None:
        """Hand each stream's new entries to its waiters. `read_from`: the ids the XREAD read
        after; a stream whose waiters changed meanwhile so that it is read from elsewhere now
        (all left, one came back from its start) is skipped: the next XREAD reads it again."""
        for raw_key, entries in reply:
            key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
            if not entries:
                continue
            last_id = entries[-1][0]
            if key == self.wake_key:
                self._wake_last = last_id
                continue
            events = [parse_event(fields) for _, fields in entries]
            with self._lock:
                if key not in self._waiters or self._last_ids.get(key) != read_from.get(key):
                    continue
                self._last_ids[key] = last_id
                waiters = list(self._waiters[key])
            for waiter in waiters:
                waiter.queue.put(events)

    def _fail_all(self, error: redis.RedisError) -> None:
        """Every waiter falls back to its row; they subscribe no more (their wait goes on
        without Redis)."""
        with self._lock:
            waiters = [w for group in self._waiters.values() for w in group]
            self._waiters.clear()
            self._last_ids.clear()
            self._wake_last = "0-0"
        if waiters:
            logger.warning("stream hub: Redis unreadable (%s): %d waiters poll their rows",
                           type(error).__name__, len(waiters))
        for waiter in waiters:
            waiter.queue.put(_Failed(error))
