"""Domain errors: each carries the HTTP status and OpenAI error type the API answers with
(`app/api/errors.py` turns them into OpenAI-style JSON error objects)."""

from __future__ import annotations

from typing import Any

__all__ = ["BlockqError", "InvalidRequest", "Unauthorized", "PermissionDenied", "NotFound",
           "Conflict", "Unprocessable", "PayloadTooLarge", "UnsupportedMediaType",
           "ServiceUnavailable"]


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


class UnsupportedMediaType(BlockqError):
    status = 415
    type = "invalid_request_error"


class ServiceUnavailable(BlockqError):
    status = 503
    type = "server_error"

