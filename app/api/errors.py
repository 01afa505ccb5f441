"""The one handler that turns domain errors and HTTP errors into OpenAI-style JSON error objects."""

from __future__ import annotations

import logging
import time

import redis
from flask import Flask, current_app, has_request_context, jsonify, request
from flask.typing import ResponseReturnValue
from flask_limiter import RateLimitExceeded
from werkzeug.exceptions import HTTPException

from app.api.held_connections import exhausted, pool_exhausted
from app.api.services import services
from domain.db import TRANSIENT_ERRORS
from domain.errors import BlockqError
from domain.slo import SloUnmeetable

__all__ = ["init_app", "RETRY_AFTER_S"]

logger = logging.getLogger(__name__)

#: Seconds a client is told to wait before retrying during a database outage.
RETRY_AFTER_S = 2


def _handle_blockq_error(error: BlockqError) -> ResponseReturnValue:
    retry_after_s = getattr(error, "retry_after_s", None)  # e.g. a model with no instance up
    if retry_after_s is not None:
        return jsonify(error.to_dict()), error.status, {"Retry-After": str(retry_after_s)}
    return jsonify(error.to_dict()), error.status


def _handle_slo_unmeetable(error: SloUnmeetable) -> ResponseReturnValue:
    """A request refused at routing: its latency targets were out of reach; retry later."""
    return jsonify(error.to_dict()), error.status, {"Retry-After": str(error.retry_after_s)}


def _handle_http_exception(error: HTTPException) -> ResponseReturnValue:
    status = error.code or 500
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 429:
        kind = "requests"  # OpenAI's type for request-rate limits
    code = {413: "request_too_large", 405: "method_not_allowed", 404: "not_found",
            429: "rate_limit_exceeded"}.get(status)
    message = _too_large_message() if status == 413 else error.description
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    if isinstance(error, RateLimitExceeded):
        return jsonify(body), status, {"Retry-After": _rate_limit_retry_after()}
    return jsonify(body), status


def _rate_limit_retry_after() -> str:
    """Seconds until the team's rate-limit window lets a call through again."""
    for limiter in current_app.extensions.get("limiter", ()):
        if (limit := limiter.current_limit) is not None:
            return str(max(1, int(limit.reset_at - time.time())))
    return "1"


def _too_large_message() -> str:
    """Werkzeug's 413 names no limit; this one does (the app's, or an endpoint's own)."""
    limit = request.max_content_length if has_request_context() else None
    return (f"The request body is larger than {limit} bytes, the largest accepted here."
            if limit else "The request body is too large.")


def _handle_outage(error: Exception) -> ResponseReturnValue:
    """The database (or, where a call cannot do without it, Redis) restarting or unreachable: a
    503 the client may retry (with the same Idempotency-Key for a submission), never a 500."""
    if pool_exhausted(error):  # Redis is up: this process's connections are all in use
        refusal = exhausted(services().settings.api_redis_connections)
        return jsonify(refusal.to_dict()), refusal.status, {"Retry-After": str(RETRY_AFTER_S)}
    service = "broker" if isinstance(error, redis.RedisError) else "database"
    logger.warning("%s unavailable: %s", service, type(error).__name__)
    body = {"error": {"message": f"The {service} is unavailable; retry shortly.",
                      "type": "server_error", "param": None, "code": "service_unavailable"}}
    return jsonify(body), 503, {"Retry-After": str(RETRY_AFTER_S)}


def init_app(app: Flask) -> None:
    app.register_error_handler(BlockqError, _handle_blockq_error)
    app.register_error_handler(SloUnmeetable, _handle_slo_unmeetable)
    app.register_error_handler(HTTPException, _handle_http_exception)
    for error in (*TRANSIENT_ERRORS, redis.ConnectionError, redis.TimeoutError):
        app.register_error_handler(error, _handle_outage)
