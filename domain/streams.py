"""Output streams: engine workers append each request's text to a Redis stream as it is
generated, and a final entry when it is over; the API reads them (SSE, or waiting for the end).

One Redis stream per request (`blockq:stream:<request id>`), kept for a while after the end so
that a reader arriving late still reads everything from the start. Entries:

    {"t": text, "a": attempt}        new output text of routing attempt `a`
    {"end": finish_reason, "a": ...} the request finished and its row is committed
    {"error": message, "a": ...}     the request failed (its row says why)

Every request gets the final entry (its waiters need it); only requests with `stream` set get
text entries.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import redis

__all__ = ["StreamWriter", "StreamEvent", "read_stream", "parse_event", "stream_key",
           "close_stream"]

#: How long a finished stream stays readable.
RETAIN_S = 600


def stream_key(request_id: str, prefix: str = "blockq") -> str:
    return f"{prefix}:stream:{request_id}"


@dataclass(frozen=True, slots=True)
class StreamEvent:
    kind: str  # "text" | "end" | "error"
    value: str  # the text, the finish reason, or the error message
    attempt: int


class StreamWriter:
    """Batches text deltas from the engine thread and appends them from a background thread
    (the engine loop must not wait for Redis); `end`/`fail` flush a request's text first.

    The background thread writes every `flush_interval_s` (Settings.stream_flush_interval_s),
    one pipeline for every request with new text, except that a request's first text wakes it
    at once: the time to first token is not held back by the batching, while later deltas (one
    per request per engine step) are still written together, a round trip per interval rather
    than per step. The API relays what it reads of a stream at once as one chunk
    (app/api/openai.py): the interval is the chunks' cadence, and each write costs the API a
    read of the stream hub and a write to the client.
    """

    def __init__(self, client: redis.Redis, *, flush_interval_s: float) -> None:
        self.redis = client
        self.flush_interval_s = flush_interval_s
        # NOTE: two locks. `_lock` guards the buffers and is held only for moments (the engine
        # thread takes it in `add`). `_write_lock` is held from taking text out of the buffers
        # until it is in Redis, so that entries reach a stream in the order they were taken: a
        # request's end entry can never overtake text that a concurrent flush has taken but not
        # yet written (readers stop at the end entry, and would lose that text).
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._pending: dict[str, list[str]] = defaultdict(list)
        self._attempts: dict[str, int] = {}
        self._started: set[str] = set()  # followed requests whose text has begun
        self._expiring: set[str] = set()  # followed requests whose stream has its TTL set
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stream-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self.flush()

    def follow(self, request_id: str, attempt: int) -> None:
        """Publish this request's text (it asked for a stream)."""
        with self._lock:
            self._attempts[request_id] = attempt

    def add(self, request_id: str, text: str) -> None:
        """New text of a request; ignored unless the request is followed. Called by the engine."""
        if text and request_id in self._attempts:
            with self._lock:
                self._pending[request_id].append(text)
                first = request_id not in self._started
                if first:
                    self._started.add(request_id)
            if first:
                self._wake.set()  # the first token goes out now, not at the next interval

    def discard(self, request_id: str) -> None:
        """Stop following a request that ended elsewhere (cancelled, or another attempt won)."""
        with self._lock:
            self._pending.pop(request_id, None)
            self._attempts.pop(request_id, None)
            self._started.discard(request_id)
            self._expiring.discard(request_id)

    def end(self, request_id: str, attempt: int, finish_reason: str) -> None:
        self._close(request_id, {"end": finish_reason, "a": attempt})

    def fail(self, request_id: str, attempt: int, message: str) -> None:
        self._close(request_id, {"error": message, "a": attempt})

    def _close(self, request_id: str, entry: dict[str, str | int]) -> None:
        with self._write_lock:
            with self._lock:
                chunks = self._pending.pop(request_id, [])
                followed_attempt = self._attempts.pop(request_id, None)
                self._started.discard(request_id)
                self._expiring.discard(request_id)
            with self.redis.pipeline(transaction=False) as pipe:
                if chunks and followed_attempt is not None:
                    pipe.xadd(stream_key(request_id),
                              {"t": "".join(chunks), "a": followed_attempt})
                pipe.xadd(stream_key(request_id), entry)
                pipe.expire(stream_key(request_id), RETAIN_S)
                pipe.execute()

    def flush(self) -> None:
        with self._write_lock:
            with self._lock:
                batch = {rid: "".join(chunks) for rid, chunks in self._pending.items() if chunks}
                attempts = {rid: self._attempts.get(rid, 0) for rid in batch}
                self._pending.clear()
                # NOTE: a stream's TTL is set with its first text and again with its end entry
                # (`_close`), not renewed by every flush in between.
                fresh = batch.keys() - self._expiring
                self._expiring.update(rid for rid in fresh if rid in self._attempts)
            if not batch:
                return
            with self.redis.pipeline(transaction=False) as pipe:
                for request_id, text in batch.items():
                    pipe.xadd(stream_key(request_id), {"t": text, "a": attempts[request_id]})
                    if request_id in fresh:
                        pipe.expire(stream_key(request_id), RETAIN_S)
                pipe.execute()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.flush()
            except redis.RedisError:  # NOTE: text is lost for streaming readers only
                continue


def close_stream(client: redis.Redis, request_id: str, attempt: int, message: str) -> None:
    """The final entry of a request that ended before any engine ran it (refused at
    routing): its waiters read it at once instead of at their next poll of the row."""
    with client.pipeline(transaction=False) as pipe:
        pipe.xadd(stream_key(request_id), {"error": message, "a": attempt})
        pipe.expire(stream_key(request_id), RETAIN_S)
        pipe.execute()


def read_stream(client: redis.Redis, request_id: str, *, block_ms: int = 1000
                ) -> Iterator[StreamEvent | None]:
    """Entries of a request's stream from the start, as they come; yields None after each
    `block_ms` without news (so the caller can check the request's row and time out)."""
    key, last_id = stream_key(request_id), "0-0"
    while True:
        reply = client.xread({key: last_id}, block=block_ms, count=256)
        if not reply:
            yield None
            continue
        for entry_id, fields in reply[0][1]:
            last_id = entry_id
            yield parse_event(fields)


def parse_event(fields: dict[bytes, bytes]) -> StreamEvent:
    """The event of one stream entry."""
    attempt = int(fields.get(b"a", b"0"))
    if b"t" in fields:
        return StreamEvent("text", fields[b"t"].decode(), attempt)
    if b"end" in fields:
        return StreamEvent("end", fields[b"end"].decode(), attempt)
    return StreamEvent("error", fields.get(b"error", b"").decode(), attempt)
