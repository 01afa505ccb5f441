"""Authentication and rate limiting of the API: `Authorization: Bearer <key>` on every /v1
endpoint, the caller's team in `flask.g.principal`, and a per-team request rate limit."""

from __future__ import annotations

import redis
from flask import Flask, g, request
from flask_limiter import HeaderNames, Limiter

from app.api.services import services
from app.errors import Unauthorized
from app.settings import Settings
from app.teams import Principal, principal_of

__all__ = ["init_app", "current_principal"]

#: Endpoints anyone may call (probes, and the metrics scraper: keep /metrics off the internet).
OPEN_ENDPOINTS = frozenset({"health.healthz", "health.readyz", "metrics.scrape", "static",
                            "openapi.document", "openapi.docs"})


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
    with services().db.autocommit() as connection:
        principal = principal_of(connection, key.strip())
    if principal is None:
        raise Unauthorized(f"Incorrect API key provided: {key.strip()[:6]}***.",
                           code="invalid_api_key")
    g.principal = principal


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
        strategy="moving-window",
        headers_enabled=True,
        # The limiter would set Retry-After on every response, overwriting the one a 503 or a
        # held-connection 429 gives; a rate-limit 429 gets its own (app.api.errors).
        header_name_mapping={HeaderNames.RETRY_AFTER: "X-RateLimit-Retry-After"},
        key_prefix="blockq:ratelimit",
        in_memory_fallback_enabled=True,
    )
