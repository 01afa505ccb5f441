"""One line of a batch input file, checked: either the columns of the request it will run, or why
it will not run.

A line is `{"custom_id", "method": "POST", "url": <the batch's endpoint>, "body": {...}}`; the
body is checked exactly as the endpoint checks its request body (domain.openai_schemas), then made a
native request (domain.commands.request_fields: prompt rendered and counted against the context).
A bad line fails alone: the batch goes on with the others.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import asdict, dataclass
from typing import Any

from domain import request_store
from domain.commands import PromptContext, request_fields
from domain.errors import BlockqError, InvalidRequest
from domain.json_input import check_value, parse_json
from domain.models import Priority
from domain.openai_schemas import body_model_for, check_model, native_body
from domain.prompts import PromptCodec
from domain.schemas import CreateRequest, parse_body
from domain.settings import Settings
from workers.batch.prefix_groups import prefix_key

__all__ = ["LineError", "CheckedLine", "LineChecker"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LineError:
    """Why a line does not run.

    `status_code` set: the endpoint refused the body; the line's result is that HTTP response
    (OpenAI's `response` with a 4xx and an error body). None: the line is not a request at all
    (not JSON, no custom_id, wrong method or url, a duplicate); the result carries `error`.
    """

    code: str
    message: str
    param: str | None = None
    status_code: int | None = None
    type: str = "invalid_request_error"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class CheckedLine:
    custom_id: str | None
    fields: dict[str, Any] | None  # the request's columns, when the line is valid
    error: LineError | None
    # The prompt's prefix key (workers.batch.prefix_groups), when the line is valid, engines
    # cache prefixes and the prompt is long enough.
    prefix_key: int | None = None


class _LastTokenIds(PromptCodec):
    """A codec that remembers the last prompt it tokenized and its ids.

    NOTE: `request_fields` tokenizes each line's prompt to count it; the line's prefix key needs
    the same ids. Tokenizing is most of what expansion costs, so it is done once.
    """

    def __init__(self, codec: PromptCodec) -> None:
        super().__init__(codec.model_path)
        self._last: tuple[str, list[int]] | None = None

    def token_ids(self, text: str) -> list[int]:
        if self._last is not None and self._last[0] == text:
            return self._last[1]
        ids = super().token_ids(text)
        self._last = (text, ids)
        return ids


@dataclass(frozen=True, slots=True)
class _Context:
    """The `PromptContext` lines are checked in: the worker's settings, a remembering codec."""

    settings: Settings
    prompts: PromptCodec


class LineChecker:
    """Checks the lines of one input file in order. It remembers the custom_ids seen (the first
    line with a custom_id owns it, later ones are duplicates) as 16-byte digests, so memory stays
    small however long the ids are: about 5 MB for 50,000 lines."""

    def __init__(self, endpoint: str, context: PromptContext, model: str | None = None) -> None:
        """`model`: the batch's (checked at creation); every line must name it. None: the
        default model."""
        self.endpoint = endpoint
        self.model = model or context.settings.default_model
        self._codec = _LastTokenIds(context.prompts)
        self.context: PromptContext = _Context(context.settings, self._codec)
        self._keyed = context.settings.engine_prefix_caching
        self._body_model = body_model_for(endpoint)
        self._custom_ids: set[bytes] = set()

    def check(self, raw: bytes) -> CheckedLine:
        try:
            line = parse_json(raw, subject="This line", check=False)
        except InvalidRequest as exc:
            return _refused(None, "invalid_json_line", exc.message)
        if not isinstance(line, dict):
            return _refused(None, "invalid_json_line", "A line must be a JSON object.")
        try:  # what is not the body: the body's values are its request's (see _fields)
            check_value({key: value for key, value in line.items() if key != "body"})
        except InvalidRequest as exc:
            return _refused(None, exc.code or "invalid_value", exc.message, exc.param)
        custom_id = line.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            return _refused(None, "missing_required_parameter",
                            "Each line needs a non-empty string 'custom_id'.", "custom_id")
        digest = hashlib.blake2b(custom_id.encode(), digest_size=16).digest()
        if digest in self._custom_ids:
            return _refused(custom_id, "duplicate_custom_id", f"The custom_id '{custom_id}' is "
                            "already used by an earlier line of this file.", "custom_id")
        self._custom_ids.add(digest)
        problem = self._check_envelope(line)
        if problem is not None:
            return CheckedLine(custom_id, None, problem)
        try:
            fields = self._fields(line["body"])
        except BlockqError as exc:
            return CheckedLine(custom_id, None, LineError(
                code=exc.code or "invalid_value", message=exc.message, param=exc.param,
                status_code=exc.status, type=exc.type))
        except Exception:  # a bug one line runs into fails that line, not the file (forever)
            logger.exception("checking a line of a %s batch failed", self.endpoint)
            return CheckedLine(custom_id, None, LineError(
                "line_check_failed", "This line could not be checked (an internal error).",
                status_code=500, type="server_error"))
        return CheckedLine(custom_id, fields, None, self._prefix_key(fields))

    def _prefix_key(self, fields: dict[str, Any]) -> int | None:
        """The prompt's prefix key from the ids it was counted by (None without caching)."""
        if not self._keyed:
            return None
        ids = fields["prompt_token_ids"]
        return prefix_key(ids if ids is not None else self._codec.token_ids(fields["prompt"]))

    def _check_envelope(self, line: dict[str, Any]) -> LineError | None:
        if line.get("method") != "POST":
            return LineError("invalid_method", f"The method must be 'POST', got "
                             f"{line.get('method')!r}.", "method")
        if line.get("url") != self.endpoint:
            return LineError("invalid_url", f"The url must be the batch's endpoint "
                             f"'{self.endpoint}', got {line.get('url')!r}.", "url")
        if not isinstance(line.get("body"), dict):
            return LineError("missing_required_parameter", "Each line needs a JSON object "
                             "'body'.", "body")
        return None

    def _fields(self, body: dict[str, Any]) -> dict[str, Any]:
        """The request's columns, or the endpoint's error (a BlockqError)."""
        check_value(body)  # what PostgreSQL cannot store, refused as the endpoint refuses it
        parsed = parse_body(self._body_model, body)
        if parsed.stream:
            raise InvalidRequest("Streaming is not available in a batch.", param="stream",
                                 code="invalid_value")
        check_model(parsed, self.model)
        native = parse_body(CreateRequest, native_body(parsed, priority=str(Priority.BATCH)))
        fields = request_fields(self.context, native)
        fields.update(body_sha256=request_store.body_digest(body), stream=False)
        return fields


def _refused(custom_id: str | None, code: str, message: str,
             param: str | None = None) -> CheckedLine:
    return CheckedLine(custom_id, None, LineError(code, message, param))
