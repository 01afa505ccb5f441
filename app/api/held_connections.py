"""Connections held open: a sync or streamed OpenAI completion holds an API connection until its
request ends (up to `sync_timeout_s`). Under gunicorn's gevent worker (`blockq serve`, the API
image) a held connection is a greenlet waiting on the process's stream hub (domain/stream_hub.py):
no thread, no Redis connection of its own. Two caps keep such connections from stopping the API:

- **Per team, over all API processes**: a slot per held connection in Redis, a sorted set per
  team (member: the slot's id; score: its lease's end, by Redis's clock). The holder renews its
  lease while it waits, so that the slots of a killed API process expire within `LEASE_S`
  instead of leaking. Over the cap: 429. This is the only limit a client meets in normal
  operation.
- **Per process**: `api_connections - api_reserved_connections`, so that connections are always
  left for `/healthz`, `/readyz` and short calls. Over it: 503.

While Redis is unreachable a completion is refused at once with 503 (Retry-After): its request
could not be routed before Redis is back, and a client holding a connection meanwhile only
waits longer than one that retries. Asynchronous submissions are still accepted (the outbox).

A held call needs the process's shared Redis pool (`api_redis_connections`) only while it sets
up (its slot, its request, its routing) and for moments after (a lease renewal, its end); its
wait holds none. A burst of one team's calls sets up at most a quarter of the pool's connections
at once (`setup`, a per-team gate; the rest wait their turn, cooperatively): a burst of 1,000
streams once took every connection, held while their greenlets waited for the CPU, and calls of
every team, another team's included, waited 5 s for one and were told the broker was down. A
pool that is still truly out answers 503 `redis_pool_exhausted` saying so, after a second.

A `Hold` also notices a client that went away while its request runs: it peeks at the client's
socket (gunicorn and werkzeug's server put it in the WSGI environ) for the end of the stream.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import redis
from flask import Flask, current_app, jsonify
from flask.typing import ResponseReturnValue

from domain.errors import BlockqError
from domain.settings import Settings

__all__ = ["init_app", "held_connections", "held_slots", "HeldConnections", "Hold",
           "TooManyHeld", "ServerBusy", "BrokerUnavailable", "RedisPoolExhausted", "ClientGone",
           "client_gone", "exhausted", "pool_exhausted", "LEASE_S", "SETUP_SHARE"]

logger = logging.getLogger(__name__)

#: How long a slot counts without being renewed (a holder renews it every LEASE_S / 3).
LEASE_S = 30.0
#: Seconds a refused client is told to wait before trying again.
RETRY_AFTER_S = 1
#: A team's held calls set up at most 1/SETUP_SHARE of the shared Redis pool's connections at
#: once (at least one).
SETUP_SHARE = 4
#: Where WSGI servers put the client's socket: gunicorn, werkzeug's development server.
SOCKET_KEYS = ("gunicorn.socket", "werkzeug.socket")
_EXTENSION = "blockq.held"

# KEYS[1]: the team's slots; ARGV: cap, lease (ms), slot id. 1: taken, 0: the team is full.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
"""
# KEYS[1]: the team's slots; ARGV: lease (ms), slot id. Puts the slot back if it was lost.
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
return 1
"""

# KEYS[1]: a request's waiters; ARGV: slot id. Takes the waiter out; returns how many others
# wait with a running lease.
_LEAVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""


class TooManyHeld(BlockqError):
    """The team holds its cap of open completions."""

    status = 429
    type = "requests"  # OpenAI's type for request-rate limits


class ServerBusy(BlockqError):
    """This API process holds all the completions its threads may."""

    status = 503
    type = "server_error"


class BrokerUnavailable(BlockqError):
    """Redis, which every held completion needs to be routed and answered, is unreachable."""

    status = 503
    type = "server_error"


class RedisPoolExhausted(BlockqError):
    """Every connection of this API process's shared Redis pool is in use (not an outage)."""

    status = 503
    type = "server_error"


def pool_exhausted(error: BaseException) -> bool:
    """Whether `error` is the shared pool having no free connection in time (redis-py's
    BlockingConnectionPool), rather than Redis failing."""
    return isinstance(error, redis.ConnectionError) and "No connection available" in str(error)


def exhausted(connections: int) -> RedisPoolExhausted:
    return RedisPoolExhausted(
        f"All {connections} Redis connections of this API process are in use (a burst of "
        "calls); Redis itself is up. Retry in a second.", code="redis_pool_exhausted")


class ClientGone(BlockqError):
    """The client closed its connection while its completion ran (nobody reads the answer)."""

    status = 499
    type = "invalid_request_error"


def client_gone(sock: socket.socket | None) -> bool:
    """Whether the peer of `sock` has closed its end (a read would return end-of-stream).

    Data waiting to be read (a pipelined request) is no sign of leaving; a socket this cannot
    look at (none, TLS, closed) never counts as gone. Readability is polled first: a socket
    with a timeout (gunicorn's) ignores MSG_DONTWAIT, and its recv would wait out the timeout
    and raise TimeoutError, which is no sign of leaving either."""
    if sock is None:
        return False
    try:
        poller = _poll()
        poller.register(sock, select.POLLIN)
        if not poller.poll(0):
            return False  # open, nothing to read
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (BlockingIOError, TimeoutError):
        return False
    except ValueError:  # TLS sockets take no flags; a closed socket has no descriptor
        return False
    except OSError:  # reset by the peer
        return True


def _poll() -> Any:
    """A `select.poll` object. gevent's monkey patching removes `select.poll` (it cannot make
    it cooperative); a poll with a zero timeout never blocks, so the original one serves. Unlike
    `select.select`, poll has no limit on descriptor numbers (thousands of sockets are open)."""
    poll = getattr(select, "poll", None)
    if poll is None:
        from gevent import monkey  # noqa: PLC0415 - only where gevent patched select

        poll = monkey.get_original("select", "poll")
    return poll()


def _key(team_id: str) -> str:
    return f"blockq:held:{team_id}"


def _waiters_key(request_id: str) -> str:
    return f"blockq:waiters:{request_id}"


def held_slots(client: redis.Redis, team_id: str) -> int:
    """Slots of the team with a running lease, over all API processes."""
    seconds, micros = client.time()
    return int(client.zcount(_key(team_id), seconds * 1000 + micros // 1000 + 1, "+inf"))


class _TeamSlots:
    """Slots per team in Redis."""

    def __init__(self, client: redis.Redis, lease_s: float, connections: int) -> None:
        self.redis = client
        self.connections = connections
        self.lease_ms = int(lease_s * 1000)
        self._take = client.register_script(_TAKE)
        self._renew = client.register_script(_RENEW)
        self._leave = client.register_script(_LEAVE)

    def take(self, team_id: str, cap: int) -> str | None:
        """A new slot's id; None when the team is full. Raises BrokerUnavailable when Redis
        cannot be reached."""
        slot = uuid.uuid4().hex
        try:
            taken = self._take(keys=[_key(team_id)], args=[cap, self.lease_ms, slot])
        except redis.RedisError as exc:
            if pool_exhausted(exc):
                logger.warning("held completion refused: the Redis pool is exhausted")
                raise exhausted(self.connections) from None
            logger.warning("held completion refused: Redis unreachable (%s)",
                           type(exc).__name__)
            raise BrokerUnavailable(
                "The message broker is unreachable, so the completion could not be served; "
                "retry shortly, or submit with POST /v1/requests (accepted while the broker is "
                "down) and poll GET /v1/requests/<id>.", code="service_unavailable") from None
        return slot if taken else None

    def renew(self, team_id: str, slot: str, request_ids: tuple[str, ...] = ()) -> None:
        """Renew the slot's lease, and its lease as a waiter of each of `request_ids`."""
        try:
            with self.redis.pipeline(transaction=False) as pipe:
                for key in (_key(team_id), *map(_waiters_key, request_ids)):
                    self._renew(keys=[key], args=[self.lease_ms, slot], client=pipe)
                pipe.execute()
        except redis.RedisError:
            pass  # the lease runs out; tried again at the next renewal

    def others_waiting(self, request_id: str, slot: str) -> int:
        """Take the slot out of the request's waiters; how many others still wait for it (0
        while Redis cannot be reached: the caller cancels, as it did before joins)."""
        try:
            return int(self._leave(keys=[_waiters_key(request_id)], args=[slot]))
        except redis.RedisError:
            return 0

    def give_back(self, team_id: str, slot: str, request_ids: tuple[str, ...] = ()) -> None:
        try:
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.zrem(_key(team_id), slot)
                for request_id in request_ids:
                    pipe.zrem(_waiters_key(request_id), slot)
                pipe.execute()
        except redis.RedisError:
            pass  # its lease runs out

    def held(self, team_id: str) -> int:
        return held_slots(self.redis, team_id)


class Hold:
    """One held connection: its team slot and process slot until `release`; `alive` renews the
    lease when due and says whether the client is still there.

    It also counts as a waiter of the requests it answers (`wait_for`), under the same slot id
    and lease: calls with the same Idempotency-Key wait for the same requests, and one whose
    client leaves cancels them only if no other call still waits (`others_waiting`)."""

    def __init__(self, owner: HeldConnections, team_id: str, slot: str,
                 sock: socket.socket | None) -> None:
        self.owner, self.team_id, self.slot = owner, team_id, slot
        self.sock = sock
        self.renewed_at = time.monotonic()
        self.request_ids: tuple[str, ...] = ()
        self._released = False
        self._lock = threading.Lock()

    def wait_for(self, request_ids: list[str]) -> None:
        """Count this connection as a waiter of `request_ids` (renewed with its lease)."""
        self.request_ids = tuple(request_ids)
        self.renewed_at = time.monotonic()
        self.owner.slots.renew(self.team_id, self.slot, self.request_ids)

    def others_waiting(self, request_id: str) -> int:
        """Stop waiting for `request_id`; how many other connections still wait for it."""
        self.request_ids = tuple(rid for rid in self.request_ids if rid != request_id)
        return self.owner.slots.others_waiting(request_id, self.slot)

    def alive(self) -> bool:
        now = time.monotonic()
        if now - self.renewed_at >= self.owner.lease_s / 3:
            self.renewed_at = now
            self.owner.slots.renew(self.team_id, self.slot, self.request_ids)
        return not client_gone(self.sock)

    def release(self) -> None:
        """Give both slots back; once only (a stream's end and its response's close both call
        this)."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self.owner.slots.give_back(self.team_id, self.slot, self.request_ids)
        self.owner.process_slots.release()


class HeldConnections:
    """The caps of one API process (see the module docstring)."""

    def __init__(self, settings: Settings, client: redis.Redis, *, lease_s: float | None = None
                 ) -> None:
        if settings.api_reserved_connections >= settings.api_connections:
            raise ValueError(
                f"api_reserved_connections ({settings.api_reserved_connections}) must be below "
                f"api_connections ({settings.api_connections}): completions would get none.")
        self.per_process = settings.api_connections - settings.api_reserved_connections
        self.per_team = settings.held_connections_per_team
        self.team_caps = settings.held_connections_team_caps
        self.lease_s = lease_s or LEASE_S
        self.slots = _TeamSlots(client, self.lease_s, settings.api_redis_connections)
        self.process_slots = threading.BoundedSemaphore(self.per_process)
        self.setups_per_team = max(1, settings.api_redis_connections // SETUP_SHARE)
        self._setups: dict[str, threading.BoundedSemaphore] = {}
        self._setups_lock = threading.Lock()

    @contextmanager
    def setup(self, team_id: str) -> Iterator[None]:
        """Around a held call's setup (its slot, request, routing): at most `setups_per_team`
        of one team's at once in this process; the others wait their turn (module docstring)."""
        with self._setups_lock:
            gate = self._setups.setdefault(team_id,
                                           threading.BoundedSemaphore(self.setups_per_team))
        with gate:
            yield

    def cap_of(self, team_name: str) -> int:
        return self.team_caps.get(team_name, self.per_team)

    def hold(self, team_id: str, team_name: str, environ: Mapping[str, Any]) -> Hold:
        """Take a slot for a connection about to be held, or refuse it (503, 429, or 503 when
        Redis is unreachable)."""
        if not self.process_slots.acquire(blocking=False):
            raise ServerBusy(
                f"This API process already holds {self.per_process} open completions (sync or "
                "streamed), all it may; retry shortly, or submit with POST /v1/requests and "
                "poll GET /v1/requests/<id>.", code="server_busy")
        cap = self.cap_of(team_name)
        try:
            slot = self.slots.take(team_id, cap)
        except BaseException:
            self.process_slots.release()
            raise
        if slot is None:
            self.process_slots.release()
            raise TooManyHeld(
                f"Your team already has {cap} completions open at once (sync or streamed), its "
                "cap on held connections; retry when one has ended, or submit with POST "
                "/v1/requests and poll GET /v1/requests/<id>.", code="concurrency_limit_exceeded")
        return Hold(self, team_id, slot, _client_socket(environ))


def _client_socket(environ: Mapping[str, Any]) -> socket.socket | None:
    for key in SOCKET_KEYS:
        sock = environ.get(key)
        if isinstance(sock, socket.socket):
            return sock
    return None


def _handle_refusal(error: TooManyHeld | ServerBusy | BrokerUnavailable | RedisPoolExhausted
                    ) -> ResponseReturnValue:
    return jsonify(error.to_dict()), error.status, {"Retry-After": str(RETRY_AFTER_S)}


def held_connections() -> HeldConnections:
    return current_app.extensions[_EXTENSION]


def init_app(app: Flask, settings: Settings, client: redis.Redis) -> None:
    app.extensions[_EXTENSION] = HeldConnections(settings, client)
    app.register_error_handler(TooManyHeld, _handle_refusal)
    app.register_error_handler(ServerBusy, _handle_refusal)
    app.register_error_handler(BrokerUnavailable, _handle_refusal)
    app.register_error_handler(RedisPoolExhausted, _handle_refusal)
