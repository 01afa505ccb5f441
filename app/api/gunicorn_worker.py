"""The API's gunicorn worker: gevent's, with the errors gunicorn answers by itself in the OpenAI
error format every other error of the API has.

gunicorn refuses some requests before the app sees them (a request line over its limit: 414; a
bare CR or LF in a header, a malformed request line: 400; too many header fields: 431) and
writes an HTML page for them with `gunicorn.util.write_error`. This worker replaces that
function, in its own process only, by one that writes `{"error": {...}}` with the same status.
"""

from __future__ import annotations

import json
import socket

from gunicorn import util
from gunicorn.workers.ggevent import GeventWorker

__all__ = ["OpenAIErrorsGeventWorker", "write_json_error"]

#: OpenAI-style codes of the statuses gunicorn answers itself.
_CODES = {400: "invalid_request", 403: "forbidden", 414: "uri_too_long",
          417: "expectation_failed", 431: "headers_too_large", 500: "internal_error",
          501: "not_implemented"}


def write_json_error(sock: socket.socket, status_int: int, reason: str, mesg: str) -> None:
    """What `gunicorn.util.write_error` writes, as an OpenAI error object."""
    body = json.dumps({"error": {
        "message": mesg or reason,
        "type": "invalid_request_error" if status_int < 500 else "server_error",
        "param": None,
        "code": _CODES.get(status_int),
    }}).encode()
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    util.write_nonblock(sock, head.encode("latin-1") + body)


class OpenAIErrorsGeventWorker(GeventWorker):
    """gunicorn's gevent worker whose own error answers are OpenAI JSON (module docstring)."""

    def init_process(self) -> None:
        # NOTE: gunicorn's workers call `util.write_error` through the module: replacing it
        # here reaches every caller, in this worker process only.
        util.write_error = write_json_error
        super().init_process()
