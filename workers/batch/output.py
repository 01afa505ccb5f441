"""The lines of a batch's output and error files, in OpenAI's batch output format. Pure.

Every input line has exactly one result line, matched by `custom_id`:
`{"id": "batch_req_...", "custom_id", "response": {"status_code", "request_id", "body"} | null,
"error": {"code", "message"} | null}`. A request that ran and succeeded goes to the output file
(`response` 200, the body the endpoint would have answered); everything else goes to the error
file: a body the endpoint refused or a request that failed as that HTTP response (4xx / 500
with an OpenAI error body), a line that was no request at all or never ran (cancelled,
expired) with `error` (codes `batch_cancelled`, `batch_expired`, ...).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from domain.models import BatchStatus, InferenceRequest, LineStatus, RequestStatus
from domain.openai_format import chat_completion_object, completion_object

__all__ = ["LineRow", "Result", "result_of", "result_line_id"]

CHAT_ENDPOINT = "/v1/chat/completions"

_NOT_RUN = {
    BatchStatus.CANCELLED: ("batch_cancelled", "The batch was cancelled before this request "
                            "finished."),
    BatchStatus.EXPIRED: ("batch_expired", "This request could not be executed before the "
                          "completion window expired."),
    BatchStatus.COMPLETED: ("request_cancelled", "The request was cancelled."),
}


@dataclass(frozen=True, slots=True)
class LineRow:
    """One line of the batch with its request (None when it never became one)."""

    line: int
    custom_id: str | None
    status: str  # LineStatus
    request_id: str
    error: dict[str, Any] | None  # workers.batch.lines.LineError, for invalid lines
    request: InferenceRequest | None


@dataclass(frozen=True, slots=True)
class Result:
    body: dict[str, Any]
    succeeded: bool  # True: the output file; False: the error file


def result_line_id(batch_id: str, line: int) -> str:
    """Stable per line, so a rerun of finalization writes the same files."""
    return "batch_req_" + hashlib.sha256(f"{batch_id}:{line}".encode()).hexdigest()[:32]


def result_of(batch_id: str, endpoint: str, model: str, final_status: BatchStatus,
              row: LineRow) -> Result:
    if row.status == LineStatus.INVALID:
        assert row.error is not None, f"invalid line {row.line} of {batch_id} has no error"
        return _refused(batch_id, row, row.error)
    request = row.request
    if request is not None and request.status == RequestStatus.SUCCEEDED:
        body = (chat_completion_object if endpoint == CHAT_ENDPOINT else completion_object)(
            request, model)
        return Result(_line(batch_id, row, response=_response(200, row.request_id, body)), True)
    if request is not None and request.status == RequestStatus.FAILED:
        error = request.error or {}
        body = _error_body(error.get("message", "The request failed."), "server_error", None,
                           error.get("type", "server_error"))
        return Result(_line(batch_id, row, response=_response(500, row.request_id, body)),
                      False)
    code, message = _NOT_RUN[final_status]
    return Result(_line(batch_id, row, error={"code": code, "message": message}), False)


def _refused(batch_id: str, row: LineRow, error: dict[str, Any]) -> Result:
    if error.get("status_code") is None:  # not a request at all
        return Result(_line(batch_id, row, error={
            "code": error["code"], "message": error["message"], "line": row.line}), False)
    body = _error_body(error["message"], error["type"], error["param"], error["code"])
    return Result(_line(batch_id, row,
                        response=_response(error["status_code"], row.request_id, body)), False)


def _line(batch_id: str, row: LineRow, *, response: dict[str, Any] | None = None,
          error: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": result_line_id(batch_id, row.line), "custom_id": row.custom_id,
            "response": response, "error": error}


def _response(status_code: int, request_id: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"status_code": status_code, "request_id": request_id, "body": body}


def _error_body(message: str, kind: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
