"""The API's logging: its role, each HTTP request's request id bound for the log lines it causes,
and one access line per call."""

from __future__ import annotations

import logging
import time
from typing import Any

from flask import Flask, g, request

from domain.logs import bind_request_id, configure
from domain.settings import Settings

__all__ = ["init_app"]

logger = logging.getLogger(__name__)

#: Endpoints not worth a log line per call: probes and the metrics scraper.
_QUIET_ENDPOINTS = frozenset({"health.healthz", "health.readyz", "metrics.scrape"})


def init_app(app: Flask, settings: Settings) -> None:
    """Configure the API process's logging (role "api"); bind each HTTP request's request id
    (from the URL; the submit path binds the one it creates) and write one access line per call."""
    configure(settings, role="api")
    app.before_request(_bind_http_request)
    app.after_request(_log_http_request)
    app.teardown_request(lambda _exc: bind_request_id(None))


def _bind_http_request() -> None:
    g.log_started_at = time.perf_counter()
    # NOTE: set on every request: server threads are reused, and so is their context.
    bind_request_id((request.view_args or {}).get("request_id"))


def _log_http_request(response: Any) -> Any:
    if request.endpoint not in _QUIET_ENDPOINTS:
        started = g.get("log_started_at")
        logger.info(
            "%s %s %s", request.method, request.path, response.status_code,
            extra={
                "method": request.method,
                "path": request.path,
                "status": response.status_code,
                "duration_ms": None if started is None
                else round((time.perf_counter() - started) * 1000, 3),
            },
        )
    return response
