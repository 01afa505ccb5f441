"""Domain errors and the one handler that turns them into OpenAI-style JSON error objects."""

from __future__ import annotations

from typing import Any

from flask import Flask, jsonify
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException

__all__ = ["BlockqError", "InvalidRequest", "Unauthorized", "PermissionDenied", "NotFound",
           "Conflict", "Unprocessable", "PayloadTooLarge", "init_app"]


class BlockqError(Exception):
    """Base of blockq's domain errors; each carries its HTTP status and OpenAI error type."""

    status: int = 500
    type: str = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def to_dict(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequest(BlockqError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(BlockqError):
    status = 401
    type = "invalid_request_error"


class PermissionDenied(BlockqError):
    status = 403
    type = "invalid_request_error"


class NotFound(BlockqError):
    status = 404
    type = "invalid_request_error"


class Conflict(BlockqError):
    status = 409
    type = "invalid_request_error"


class Unprocessable(BlockqError):
    status = 422
    type = "invalid_request_error"


class PayloadTooLarge(BlockqError):
    status = 413
    type = "invalid_request_error"


class ServiceUnavailable(BlockqError):
    status = 503
    type = "server_error"


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
