"""The API's gunicorn worker: gevent's, with the errors gunicorn answers by itself in the OpenAI
error format every other error of the API has, and a deadline on reading a request's body.

gunicorn refuses some requests before the app sees them (a request line over its limit: 414; a
bare CR or LF in a header, a malformed request line: 400; too many header fields: 431) and
writes an HTML page for them with `gunicorn.util.write_error`. This worker replaces that
function, in its own process only, by one that writes `{"error": {...}}` with the same status.

gunicorn reads a body only as the app asks for it, from a blocking socket with no timeout: a
client that declares `Content-Length: 500` and sends 45 bytes held its connection (and its
greenlet) forever. Here every body read of a request shares one deadline,
`api_body_read_timeout_s` after the first: past it the read raises `BodyReadTimeout` (408, in
the app's error format) and the connection is closed after the answer (the rest of the body
never came, so the connection cannot carry another request).

gunicorn stops its master, and every other worker with it, when a worker fails to build the app
("Worker failed to boot", exit 3). A replacement worker booting in a bad second (a service
restarting, memory short) would take the whole API down. This worker logs the traceback and
tries again (`BOOT_RETRIES_S`); only an app that still cannot be built stops the master, and the
supervisor then reports it and starts the API again.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import gevent
from gunicorn import util
from gunicorn.workers.ggevent import GeventWorker

from domain.errors import BlockqError
from domain.settings import Settings

__all__ = ["BOOT_RETRIES_S", "BodyReadTimeout", "OpenAIErrorsGeventWorker", "TimedInput",
           "write_json_error"]

#: Seconds between a worker's attempts to build the app: five attempts over about 15 s, within
#: gunicorn's 30 s worker timeout of each (the worker tells its master it lives before each wait).
BOOT_RETRIES_S = (1.0, 2.0, 4.0, 8.0)

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


class BodyReadTimeout(BlockqError):
    """The client did not send its whole request body in time."""

    status = 408
    type = "invalid_request_error"


class TimedInput:
    """A request's `wsgi.input` whose reads together end `timeout_s` after the first began."""

    def __init__(self, stream: Any, timeout_s: float) -> None:
        self._stream = stream
        self._timeout_s = timeout_s
        self._deadline: float | None = None
        #: Whether a read ran out of time (the connection must then close).
        self.timed_out = False

    def _timed(self, read: Callable[..., Any], *args: Any) -> Any:
        if self._deadline is None:
            self._deadline = time.monotonic() + self._timeout_s
        error = BodyReadTimeout(
            f"The request body did not arrive within {self._timeout_s:g} s (fewer bytes than "
            "its Content-Length?).", code="request_timeout")
        try:
            with gevent.Timeout(max(self._deadline - time.monotonic(), 0.001), error):
                return read(*args)
        except BodyReadTimeout:
            self.timed_out = True
            raise

    def read(self, size: int | None = None) -> bytes:
        return self._timed(self._stream.read, size)  # type: ignore[no-any-return]

    def readline(self, size: int | None = None) -> bytes:
        return self._timed(self._stream.readline, size)  # type: ignore[no-any-return]

    def readlines(self, hint: int | None = None) -> list[bytes]:
        return self._timed(self._stream.readlines, hint)  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def with_body_deadline(app: WsgiApp, timeout_s: float) -> WsgiApp:
    """`app` whose request bodies are TimedInput; a connection whose body timed out closes."""
    def timed_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        body = TimedInput(environ["wsgi.input"], timeout_s)
        environ["wsgi.input"] = body
        result = app(environ, start_response)
        # NOTE: gunicorn's start_response is its Response's method; the app may not set the
        # hop-by-hop Connection header itself (gunicorn drops it).
        if body.timed_out and hasattr(start_response, "__self__"):
            start_response.__self__.force_close()
        return result
    return timed_app


class OpenAIErrorsGeventWorker(GeventWorker):
    """gunicorn's gevent worker whose own error answers are OpenAI JSON, with a deadline on
    request bodies (module docstring)."""

    def init_process(self) -> None:
        # NOTE: gunicorn's workers call `util.write_error` through the module: replacing it
        # here reaches every caller, in this worker process only.
        util.write_error = write_json_error
        super().init_process()

    def load_wsgi(self) -> None:
        for wait_s in (*BOOT_RETRIES_S, None):
            try:
                super().load_wsgi()
                break
            except Exception:
                if wait_s is None:
                    raise  # gunicorn logs it and stops the master (module docstring)
                self.log.exception("building the app failed; trying again in %.0f s", wait_s)
                self.notify()
                time.sleep(wait_s)
        self.wsgi = with_body_deadline(self.wsgi, Settings.load().api_body_read_timeout_s)
