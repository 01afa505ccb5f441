"""Liveness and readiness probes."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify
from flask.typing import ResponseReturnValue
from sqlalchemy import text

from app.api.services import services

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> ResponseReturnValue:
    """The process is up; says nothing about its dependencies."""
    return jsonify(status="ok")


@bp.get("/health")
def health() -> ResponseReturnValue:
    """vLLM's server's probe, as it answers it: 200 with an empty body while the process is up.

    Third-party benchmark clients (guidellm, aiperf) check it before they start."""
    return Response(status=200, mimetype="text/plain")


@bp.get("/readyz")
def readyz() -> ResponseReturnValue:
    """Ready only when the database and the broker both answer."""
    checks = {"database": _check_database(), "broker": _check_broker()}
    ready = all(value == "ok" for value in checks.values())
    return jsonify(status="ready" if ready else "not_ready", checks=checks), 200 if ready else 503


def _check_database() -> str:
    try:
        with services().db.session() as session:
            session.execute(text("SELECT 1"))
        return "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means not ready; reported, not raised
        return f"error: {type(exc).__name__}"


def _check_broker() -> str:
    try:
        services().fleet.ping()
        return "ok"
    except Exception as exc:  # noqa: BLE001 - same as above
        return f"error: {type(exc).__name__}"
