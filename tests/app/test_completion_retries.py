"""Retried completions (`Idempotency-Key` on /v1/completions and /v1/chat/completions) join the
first call's request instead of running it twice, and a request whose callers have all left is
cancelled (the cancel flag its engine aborts on), not before.

The app is served by werkzeug's threaded server on 127.0.0.1, called by raw sockets and httpx.
No Celery worker runs: the test ends a request as its engine worker would (its row, then its
stream's entries). Real PostgreSQL and Redis.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
from sqlalchemy import select

from app import create_app
from domain import request_store
from domain.models import InferenceRequest, RequestStatus, utcnow
from domain.services import Services
from domain.settings import Settings
from domain.streams import stream_key
from domain.teams import ensure_team_key

pytestmark = pytest.mark.services

CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


@dataclass
class Api:
    url: str
    port: int
    services: Services
    key: str
    team_id: str

    def call(self, idempotency_key: str, body: dict | None = None) -> socket.socket:
        """A raw client that sends a chat completion under the key and reads nothing yet."""
        payload = json.dumps(body or CHAT).encode()
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=20)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     + f"Authorization: Bearer {self.key}\r\n".encode()
                     + f"Idempotency-Key: {idempotency_key}\r\n".encode()
                     + b"Content-Type: application/json\r\n"
                     + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        return sock

    def requests(self) -> list[InferenceRequest]:
        with self.services.db.session() as session:
            return list(session.scalars(select(InferenceRequest).where(
                InferenceRequest.team_id == self.team_id).order_by(InferenceRequest.created_at)))

    def waiters(self, request_id: str) -> int:
        return int(self.services.fleet.redis.zcard(f"blockq:waiters:{request_id}"))

    def status(self, request_id: str) -> str:
        with self.services.db.session() as session:
            return str(request_store.get_request(session, request_id).status)

    def finish(self, request_id: str, text: str, *, streamed: tuple[str, ...] = ()) -> None:
        """What an engine worker does at a request's end: its row, then its stream's end."""
        with self.services.db.session() as session:
            assert request_store.transition(session, request_id, RequestStatus.SUCCEEDED,
                                    allowed_from=request_store.ACTIVE_STATUSES, output_text=text,
                                    output_tokens=2, finish_reason="stop", finished_at=utcnow())
        self.stream(request_id, *streamed)
        self.services.fleet.redis.xadd(stream_key(request_id), {"end": "stop", "a": 1})

    def stream(self, request_id: str, *texts: str) -> None:
        for text in texts:
            self.services.fleet.redis.xadd(stream_key(request_id), {"t": text, "a": 1})


@pytest.fixture
def api(fresh_services: Settings) -> Iterator[Api]:
    from werkzeug.serving import make_server  # noqa: PLC0415

    settings = fresh_services.model_copy(update={
        "held_connections_per_team": 8, "api_connections": 16, "api_reserved_connections": 4,
        "sync_timeout_s": 30.0})
    app = create_app(settings)
    server = make_server("127.0.0.1", settings.api_port, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    services: Services = app.extensions["blockq"]
    with services.db.session() as session:
        issued = ensure_team_key(session, "a")
    try:
        yield Api(f"http://127.0.0.1:{settings.api_port}", settings.api_port, services,
                  issued.key, issued.team_id)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
        services.db.dispose()


def eventually(check: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def answer_of(sock: socket.socket) -> tuple[int, dict[str, str], dict]:
    """Status, headers and JSON body of the (complete, non-streamed) answer on `sock`."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
        chunk = sock.recv(65536)
        assert chunk, f"connection closed early: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body)


def _length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 30


def _one_request(api: Api) -> str:
    eventually(lambda: len(api.requests()) == 1)
    return api.requests()[0].id


def test_a_retried_completion_joins_the_running_request_and_both_get_its_answer(
        api: Api) -> None:
    first, retry = api.call("k1"), api.call("k1")
    request_id = _one_request(api)
    eventually(lambda: api.waiters(request_id) == 2)
    assert len(api.requests()) == 1  # one generation, not two

    api.finish(request_id, "Hello!")

    for sock in (first, retry):
        status, headers, body = answer_of(sock)
        assert status == 200 and headers["x-request-id"] == request_id
        assert body["choices"][0]["message"]["content"] == "Hello!"
        sock.close()
    headers = {"Authorization": f"Bearer {api.key}", "Idempotency-Key": "k1"}
    later = httpx.post(f"{api.url}/v1/chat/completions", json=CHAT, headers=headers, timeout=10)
    assert later.status_code == 200 and later.headers["x-request-id"] == request_id
    assert later.json()["choices"][0]["message"]["content"] == "Hello!"  # replayed at once
    other = httpx.post(f"{api.url}/v1/chat/completions", json={**CHAT, "max_tokens": 5},
                       headers=headers, timeout=10)
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"
    assert len(api.requests()) == 1


def test_a_stream_joined_with_the_key_replays_from_the_first_token(api: Api) -> None:
    body = {**CHAT, "stream": True}
    first = api.call("s1", body)
    request_id = _one_request(api)
    api.stream(request_id, "Hel")
    replayed: list[str] = []

    def retry() -> None:
        headers = {"Authorization": f"Bearer {api.key}", "Idempotency-Key": "s1"}
        with httpx.stream("POST", f"{api.url}/v1/chat/completions", json=body,
                          headers=headers, timeout=20) as response:
            assert response.headers["x-request-id"] == request_id
            replayed.extend(line for line in response.iter_lines() if line.startswith("data:"))

    thread = threading.Thread(target=retry)
    thread.start()
    eventually(lambda: api.waiters(request_id) == 2)
    api.finish(request_id, "Hello", streamed=("lo",))
    thread.join(timeout=20)

    chunks = [json.loads(line[6:]) for line in replayed[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Hello" and replayed[-1] == "data: [DONE]"
    first.close()
    assert len(api.requests()) == 1


def test_a_request_is_cancelled_when_its_last_caller_leaves_and_a_retry_starts_again(
        api: Api) -> None:
    first, second = api.call("c1"), api.call("c1")
    request_id = _one_request(api)
    eventually(lambda: api.waiters(request_id) == 2)

    first.close()  # another call still waits for it: it runs on
    eventually(lambda: api.waiters(request_id) == 1)
    assert api.status(request_id) in ("queued", "predicting")
    assert not api.services.fleet.cancelled([request_id])

    second.close()  # nobody waits: cancelled, and its engine told to abort it
    eventually(lambda: api.status(request_id) == "cancelled")
    assert api.services.fleet.cancelled([request_id]) == {request_id}

    again = api.call("c1")  # a cancelled request never answers: the retry starts again
    eventually(lambda: len(api.requests()) == 2)
    assert api.requests()[1].id != request_id
    again.close()
