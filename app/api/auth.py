"""Authentication and rate limiting of the API: `Authorization: Bearer <key>` on every /v1
endpoint, the caller's team in `flask.g.principal`, and a per-team request rate limit."""

from __future__ import annotations

import time
from typing import Any

import redis
from flask import Flask, g, request
from flask_limiter import HeaderNames, Limiter
from limits import RateLimitItem, WindowStats
from limits.storage import RedisStorage, Storage
from limits.strategies import STRATEGIES, MovingWindowRateLimiter

from app.api.services import services
from domain.errors import Unauthorized
from domain.settings import Settings
from domain.teams import Principal

__all__ = ["init_app", "current_principal"]

#: Endpoints anyone may call (probes, and the metrics scraper: keep /metrics off the internet).
OPEN_ENDPOINTS = frozenset({"health.healthz", "health.health", "health.readyz", "metrics.scrape",
                            "static", "openapi.document", "openapi.docs"})


def current_principal() -> Principal:
    principal = g.get("principal")
    assert principal is not None, "called from an endpoint that is not authenticated"
    return principal


def _authenticate() -> None:
    g.principal = None
    if request.endpoint is None or request.endpoint in OPEN_ENDPOINTS:
        return  # no such route (the 404 handler answers), or a probe
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("You didn't provide an API key. Send it in the Authorization header: "
                           "'Authorization: Bearer YOUR_KEY'.", code="missing_api_key")
    svc = services()
    principal = svc.principals.lookup(svc.db, key.strip())
    if principal is None:
        raise Unauthorized(f"Incorrect API key provided: {key.strip()[:6]}***.",
                           code="invalid_api_key")
    g.principal = principal


#: The moving window of limits' `moving-window` strategy (its two Lua scripts, acquire and
#: read, in one): KEYS[1] the window's list; ARGV: now, limit, expiry (s), cost. Returns
#: {1 if acquired else 0, the oldest entry in the window or false, the entries in the window}.
_ACQUIRE_AND_READ = """
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local expiry, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local acquired = 0
if cost <= limit then
    local entry = redis.call('lindex', KEYS[1], limit - cost)
    if not (entry and tonumber(entry) >= now - expiry) then
        local entries = {}
        for i = 1, cost do entries[i] = now end
        for i = 1, #entries, 5000 do
            redis.call('lpush', KEYS[1], unpack(entries, i, math.min(i + 4999, #entries)))
        end
        redis.call('ltrim', KEYS[1], 0, limit - 1)
        redis.call('expire', KEYS[1], expiry)
        acquired = 1
    end
end
local low, high, found = 0, limit - 1, nil
while low <= high do
    local mid = math.floor((low + high) / 2)
    local value = tonumber(redis.call('lindex', KEYS[1], mid))
    if value and value >= now - expiry then
        found, low = mid, mid + 1
    else
        high = mid - 1
    end
end
if not found then return {acquired, false, 0} end
return {acquired, redis.call('lindex', KEYS[1], found), found + 1}
"""
#: The strategy's name in limits' registry, which flask-limiter builds its strategies from.
STRATEGY = "blockq-moving-window"


class MovingWindowOneTrip(MovingWindowRateLimiter):
    """limits' moving window, whose hit reads the window too: flask-limiter reads it after each
    hit for the response's X-RateLimit headers, a second Redis round trip on every call. The
    window read with the hit serves that request's headers (and its 429's Retry-After); other
    storages (the in-memory fallback while Redis is down) count as limits does."""

    def __init__(self, storage: Storage) -> None:
        super().__init__(storage)
        self._script = (storage.get_connection().register_script(_ACQUIRE_AND_READ)
                        if isinstance(storage, RedisStorage) else None)

    def hit(self, item: RateLimitItem, *identifiers: str, cost: int = 1) -> bool:
        if self._script is None:
            return super().hit(item, *identifiers, cost=cost)
        key, now, expiry = item.key_for(*identifiers), time.time(), item.get_expiry()
        storage: Any = self.storage
        acquired, oldest, count = self._script(
            keys=[storage.prefixed_key(key)], args=[now, item.amount, expiry, cost])
        start = float(oldest) if count else now
        _windows()[key] = WindowStats(start + expiry, item.amount - int(count))
        return bool(acquired)

    def get_window_stats(self, item: RateLimitItem, *identifiers: str) -> WindowStats:
        window = _windows().get(item.key_for(*identifiers))
        return window if window is not None else super().get_window_stats(item, *identifiers)


def _windows() -> dict[str, WindowStats]:
    """The windows this request's hits read, by limit key."""
    return g.setdefault("rate_limit_windows", {})


STRATEGIES[STRATEGY] = MovingWindowOneTrip


def init_app(app: Flask, settings: Settings, pool: redis.ConnectionPool) -> Limiter:
    """Authenticate first, then count the request against its team's limit (Redis-backed, so
    every API process shares the count).

    While Redis is unreachable the limit is counted in each API process's memory instead (each
    process allows the team's whole limit, so the fleet-wide limit is looser by the number of
    API processes); calls go on, and the shared count resumes once Redis answers again.
    """
    app.before_request(_authenticate)

    def team_limit() -> str:
        principal = g.get("principal")
        rpm = principal.rate_limit_rpm if principal and principal.rate_limit_rpm else None
        return f"{rpm or settings.rate_limit_rpm}/minute"

    return Limiter(
        key_func=lambda: g.principal.team_id,
        app=app,
        application_limits=[team_limit],
        application_limits_exempt_when=lambda: g.get("principal") is None,
        storage_uri=settings.redis_url,
        storage_options={"connection_pool": pool},  # the worker's shared, bounded pool
        strategy=STRATEGY,
        headers_enabled=True,
        # The limiter would set Retry-After on every response, overwriting the one a 503 or a
        # held-connection 429 gives; a rate-limit 429 gets its own (app.api.errors).
        header_name_mapping={HeaderNames.RETRY_AFTER: "X-RateLimit-Retry-After"},
        key_prefix="blockq:ratelimit",
        in_memory_fallback_enabled=True,
    )
