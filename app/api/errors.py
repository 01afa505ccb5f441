"""The one handler that turns domain errors and HTTP errors into OpenAI-style JSON error objects."""

from __future__ import annotations

from flask import Flask, jsonify
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException

from app.errors import BlockqError

__all__ = ["init_app"]


def _handle_blockq_error(error: BlockqError) -> ResponseReturnValue:
    return jsonify(error.to_dict()), error.status


def _handle_http_exception(error: HTTPException) -> ResponseReturnValue:
    status = error.code or 500
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 429:
        kind = "requests"  # OpenAI's type for request-rate limits
    code = {413: "request_too_large", 405: "method_not_allowed", 404: "not_found",
            429: "rate_limit_exceeded"}.get(status)
    body = {"error": {"message": error.description, "type": kind, "param": None, "code": code}}
    return jsonify(body), status


def init_app(app: Flask) -> None:
    app.register_error_handler(BlockqError, _handle_blockq_error)
    app.register_error_handler(HTTPException, _handle_http_exception)
