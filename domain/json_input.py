"""Untrusted JSON (a request body, a batch input line) read into Python values that PostgreSQL
will store, or refused with a 400 that names the problem and, where there is one, its path.

Python's `json` accepts more than PostgreSQL stores: `NaN`/`Infinity` (and numbers such as 1e400
that overflow to infinity; the `json` type refuses them) and lone surrogates such as `\\ud800`
(not encodable as UTF-8). NUL (`\\u0000`) is accepted, as vLLM's server accepts it: the `json`
type keeps it escaped, and the text columns that hold prompts and answers store it escaped
(`domain.models.ExactText`). Its parser also
recurses once per nesting level, so 100,000 nested arrays raise RecursionError. Here the depth is
measured first, by a scan that does not recurse, and every string, key and number of the parsed
document is checked, so such input is refused before anything is written.

Pure: no Flask, no I/O. The API (`app.api.json_body`) and the batch workers (one input line at a
time) both read JSON through `parse_json`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from domain.errors import InvalidRequest

__all__ = ["MAX_DEPTH", "parse_json", "parse_json_object", "nesting_depth", "check_value",
           "text_problem", "visible"]

#: Deepest nesting of arrays and objects accepted (OpenAI's bodies need fewer than 10 levels).
MAX_DEPTH = 64
_BOM = b"\xef\xbb\xbf"
#: A string (to its closing quote or, unterminated, to the end: no backtracking) or a bracket.
_TOKENS = re.compile(r'"(?:[^"\\]++|\\.)*+"?|[\[\]{}]', re.DOTALL)
#: What PostgreSQL cannot store in text: NUL, and UTF-16 surrogates (lone: a valid pair in JSON
#: decodes to one code point above U+FFFF).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
#: What no JSON value of a body may hold: surrogates (NUL is stored escaped, see above).
_UNENCODABLE = re.compile("[\ud800-\udfff]")
#: Longest `param` an error names (a key may be as long as the body).
_MAX_PARAM_CHARS = 200


class _Refused:
    """A parsed number PostgreSQL cannot store, kept in place so its path can be named."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem


def parse_json(raw: bytes, *, subject: str = "The request body", check: bool = True) -> Any:
    """The JSON document in `raw` (UTF-8, an optional BOM), checked: see the module docstring.
    `subject` starts each error message ("The request body", "This line"). `check=False` leaves
    the values unchecked, for a caller that checks its parts apart (`check_value`), as a batch
    line does: a bad value in its body fails the line's request, not the line."""
    text = _decode(raw, subject)
    depth, offset = nesting_depth(text)
    if depth > MAX_DEPTH:
        raise InvalidRequest(f"{subject} is nested deeper than {MAX_DEPTH} levels of arrays and "
                             f"objects (at character {offset}).", code="invalid_json")
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_float,
                           parse_int=_int)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"{subject} is not valid JSON: {exc.msg} (line {exc.lineno}, "
                             f"column {exc.colno}).", code="invalid_json") from None
    except RecursionError:  # NOTE: unreachable after the depth scan; kept as a backstop
        raise InvalidRequest(f"{subject} is nested too deeply.", code="invalid_json") from None
    if check:
        check_value(value)
    return value


def parse_json_object(raw: bytes, *, subject: str = "The request body") -> dict[str, Any]:
    """`parse_json`, refusing anything but an object."""
    if not raw.strip():
        raise InvalidRequest(f"{subject} is empty; it must be a JSON object.",
                             code="invalid_json")
    value = parse_json(raw, subject=subject)
    if not isinstance(value, dict):
        raise InvalidRequest(f"{subject} must be a JSON object, not {_json_type(value)}.",
                             code="invalid_json")
    return value


def nesting_depth(text: str, limit: int = MAX_DEPTH) -> tuple[int, int]:
    """(deepest nesting of arrays and objects, the character offset where it was reached), the
    scan stopping once past `limit`. Brackets inside strings do not count. Linear, no recursion:
    it is what makes 100,000 nested arrays a cheap refusal."""
    depth = deepest = where = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            if depth > deepest:
                deepest, where = depth, match.start()
                if deepest > limit:
                    break
        elif token in ("]", "}"):
            depth -= 1
    return deepest, where


def check_value(value: Any) -> None:
    """Refuse the first string, key or number of `value` PostgreSQL cannot store, naming its
    path (`messages.0.content`, as validation errors do). Iterative: no recursion."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            _check_text(item, path, "string")
        elif isinstance(item, _Refused):
            raise _at(path, item.problem)
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                _check_text(key, path, "key")
                stack.append((child, (*path, key)))
        elif isinstance(item, list):
            stack.extend((child, (*path, str(i))) for i, child in reversed(list(enumerate(item))))


def _decode(raw: bytes, subject: str) -> str:
    try:
        return raw.removeprefix(_BOM).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"{subject} is not valid UTF-8 (byte {exc.start}).",
                             code="invalid_json") from None


def text_problem(text: str, unstorable: re.Pattern[str] = _UNSTORABLE) -> str | None:
    """What in `text` PostgreSQL cannot store ("the NUL character (\\u0000), ..."), or None."""
    found = unstorable.search(text)
    if found is None:
        return None
    char = found.group()
    return ("the NUL character (\\u0000), which text may not contain" if char == "\x00"
            else f"a lone surrogate (\\u{ord(char):04x}), which is not Unicode text")


def _check_text(text: str, path: tuple[str, ...], kind: str) -> None:
    what = text_problem(text, _UNENCODABLE)
    if what is not None:
        where = (*path, text) if kind == "key" else path
        raise _at(where, f"the {kind} contains {what}")


def _at(path: tuple[str, ...], problem: str) -> InvalidRequest:
    param = visible(".".join(path))[:_MAX_PARAM_CHARS] or None
    message = f"Invalid value for '{param}': {problem}." if param else f"Invalid value: {problem}."
    return InvalidRequest(message, param=param, code="invalid_value")


def visible(text: str) -> str:
    """`text` with what `text_problem` finds written as JSON escapes (safe to quote, to store)."""
    return _UNSTORABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _refuse_constant(name: str) -> _Refused:
    return _Refused(f"{name} is not a JSON number")


def _float(literal: str) -> float | _Refused:
    value = float(literal)
    return value if math.isfinite(value) else _Refused(f"the number {literal[:40]} is out of "
                                                       "range")


def _int(literal: str) -> int | _Refused:
    try:
        return int(literal)
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
        return _Refused(f"the integer of {len(literal)} digits is out of range")


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"
