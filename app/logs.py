"""Log lines of every blockq process: one JSON object per line (or plain text), each saying which
process wrote it (its role) and, when known, which request it was about.

The request id travels in a context variable: the API sets it from the request being created or
read (`app/api/access_log.py`), each Celery task from its request id argument
(`workers/observability.py`). A filter on the one handler installed here copies it, with the
role, onto every record. Secrets never reach the
output: API keys, webhook secrets and URL passwords are masked in every formatted line.
"""

from __future__ import annotations

import contextvars
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from pythonjsonlogger.json import JsonFormatter

from app.settings import Settings

__all__ = [
    "configure",
    "set_role",
    "bind_request_id",
    "current_request_id",
    "request_id_of",
    "redact",
]

logger = logging.getLogger(__name__)

#: Request ids are "req_" + 32 hex digits (app.store.new_request_id).
REQUEST_ID_PREFIX = "req_"

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "blockq_request_id", default=None
)
# NOTE: one role per process (api, predict, route, gpu.0, beat, ...), set once at start-up.
_role = "blockq"

_SECRETS = (
    (re.compile(r"\bbq-[A-Za-z0-9_-]{8,}"), "bq-***"),
    (re.compile(r"\bwhsec_[A-Za-z0-9+/=]+"), "whsec_***"),
    (re.compile(r"(://[^/\s:@]*:)[^/\s@]+@"), r"\1***@"),
)


def redact(text: str) -> str:
    """`text` with API keys, webhook secrets and URL passwords masked."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


# --- the request id and the role ---------------------------------------------------------------
def bind_request_id(request_id: str | None) -> None:
    """The request the current thread (task, HTTP request) works on from now on."""
    _request_id.set(request_id)


def current_request_id() -> str | None:
    return _request_id.get()


def request_id_of(args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> str | None:
    """The request id a task was called with: its `request_id` keyword, else its first
    positional argument when that is a request id (batch tasks take batch ids: None)."""
    candidate = (kwargs or {}).get("request_id") or (args[0] if args else None)
    if isinstance(candidate, str) and candidate.startswith(REQUEST_ID_PREFIX):
        return candidate
    return None


def set_role(role: str) -> None:
    global _role
    _role = role


class _ContextFilter(logging.Filter):
    """Adds `role` and, when known, `request_id` to every record the handler emits."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.role = _role
        request_id = _request_id.get()
        if request_id is not None:
            record.request_id = request_id
        return True


# --- formatters --------------------------------------------------------------------------------
class _JsonFormatter(JsonFormatter):
    """time, level, logger, message first; then role, request_id and any `extra` fields."""

    def __init__(self) -> None:
        super().__init__("{levelname}{name}{message}", style="{",
                         rename_fields={"levelname": "level", "name": "logger"})

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord,
                   message_dict: dict[str, Any]) -> None:
        log_data["time"] = datetime.fromtimestamp(record.created, UTC).isoformat(
            timespec="milliseconds")
        super().add_fields(log_data, record, message_dict)

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class _TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(role)s %(name)s [%(request_id)s] %(message)s",
                         defaults={"role": "-", "request_id": "-"})

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class _BlockqHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler `configure` installs; a later `configure` replaces it."""


def configure(settings: Settings, *, role: str, stream: TextIO | None = None) -> None:
    """Send this process's log records to `stream` (default stderr) in `settings.log_format`,
    at `settings.log_level`, tagged with `role`. Safe to call again (the handler is replaced);
    handlers installed by others (a test runner's) are left alone."""
    set_role(role)
    handler = _BlockqHandler(stream or sys.stderr)
    handler.setFormatter(_JsonFormatter() if settings.log_format == "json" else _TextFormatter())
    handler.addFilter(_ContextFilter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _BlockqHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.log_level)
    # NOTE: httpx logs every request's URL at INFO, and webhook URLs may carry tokens.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
