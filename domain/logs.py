"""Log lines of every blockq process: one JSON object per line (or plain text), each saying which
process wrote it (its role) and, when known, which request it was about.

The request id travels in a context variable: the API sets it from the request being created or
read (`app/api/access_log.py`), each Celery task from its request id argument
(`workers/observability.py`). A filter on the one handler installed here copies it, with the
role, onto every record. Secrets never reach the
output: API keys, webhook secrets and URL passwords are masked in every formatted line. Neither
does request content, unless the debug setting `log_request_content` is on: the databases are
built with `hide_parameters` (domain/db.py), and what an error could still quote of a prompt or an
output (bound parameters, PostgreSQL's quote of the JSON it refused) is cut from each line.
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

from domain.settings import Settings

__all__ = [
    "configure",
    "set_role",
    "bind_request_id",
    "current_request_id",
    "request_id_of",
    "redact",
]

logger = logging.getLogger(__name__)

#: Request ids are "req_" + 32 hex digits (domain.request_store.new_request_id).
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


#: What an error message may quote of the values a statement carried: SQLAlchemy's rendering of
#: bound parameters, PostgreSQL's CONTEXT quoting the JSON text it refused.
_CONTENT = (
    (re.compile(r"\[parameters: [^\n]*"), "[parameters hidden]"),
    (re.compile(r"(CONTEXT:\s+JSON data, line \d+:)[^\n]*"), r"\1 (hidden)"),
)


def hide_content(text: str) -> str:
    """`text` without the request content an error message may quote (see _CONTENT)."""
    for pattern, replacement in _CONTENT:
        text = pattern.sub(replacement, text)
    return text


_PLAIN = logging.Formatter()


def _without_content(record: logging.LogRecord) -> logging.LogRecord:
    """A copy of `record` whose message and traceback text went through hide_content (the
    record itself is shared with other handlers and left alone)."""
    copy = logging.makeLogRecord(dict(record.__dict__))
    copy.msg, copy.args = hide_content(record.getMessage()), None
    if record.exc_info:
        copy.exc_text = hide_content(record.exc_text or _PLAIN.formatException(record.exc_info))
        copy.exc_info = None
    return copy


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

    def __init__(self, *, show_content: bool = False) -> None:
        self.show_content = show_content
        super().__init__("{levelname}{name}{message}", style="{",
                         rename_fields={"levelname": "level", "name": "logger"})

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord,
                   message_dict: dict[str, Any]) -> None:
        log_data["time"] = datetime.fromtimestamp(record.created, UTC).isoformat(
            timespec="milliseconds")
        super().add_fields(log_data, record, message_dict)

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record if self.show_content else _without_content(record)))


class _TextFormatter(logging.Formatter):
    def __init__(self, *, show_content: bool = False) -> None:
        self.show_content = show_content
        super().__init__("%(asctime)s %(levelname)s %(role)s %(name)s [%(request_id)s] %(message)s",
                         defaults={"role": "-", "request_id": "-"})

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record if self.show_content else _without_content(record)))


class _BlockqHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler `configure` installs; a later `configure` replaces it."""


def configure(settings: Settings, *, role: str, stream: TextIO | None = None) -> None:
    """Send this process's log records to `stream` (default stderr) in `settings.log_format`,
    at `settings.log_level`, tagged with `role`. Safe to call again (the handler is replaced);
    handlers installed by others (a test runner's) are left alone."""
    set_role(role)
    handler = _BlockqHandler(stream or sys.stderr)
    show = settings.log_request_content
    handler.setFormatter(_JsonFormatter(show_content=show) if settings.log_format == "json"
                         else _TextFormatter(show_content=show))
    handler.addFilter(_ContextFilter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _BlockqHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.log_level)
    # NOTE: httpx logs every request's URL at INFO, and webhook URLs may carry tokens.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
