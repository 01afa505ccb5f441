"""Text a request carries outside its JSON body (the URL path, query parameters, the
Idempotency-Key header) is checked before any handler runs: NUL or a lone surrogate there would
reach a PostgreSQL query (a lookup by id, a cursor, a filter) and fail it with a 500. A stored
header must come once: the WSGI server joins repeated headers with commas ("a,b"), which would
silently become a key of its own."""

from __future__ import annotations

from flask import Flask, request

from domain.errors import InvalidRequest
from domain.json_input import text_problem, visible

__all__ = ["init_app"]

#: Headers whose value is stored or looked up in the database.
STORED_HEADERS = ("Idempotency-Key",)


def init_app(app: Flask) -> None:
    app.before_request(check_request_text)


def check_request_text() -> None:
    if (problem := text_problem(request.path)) is not None:
        raise InvalidRequest(f"The URL path contains {problem}.", code="invalid_path")
    for key, value in request.args.items(multi=True):
        if (problem := text_problem(key) or text_problem(value)) is not None:
            raise InvalidRequest(f"The query parameter '{visible(key)}' contains {problem}.",
                                 param=visible(key), code="invalid_value")
    for header in STORED_HEADERS:
        value = request.headers.get(header)
        if value is not None and (problem := text_problem(value)) is not None:
            raise InvalidRequest(f"The {header} header contains {problem}.", param=header,
                                 code="invalid_value")
        if value is not None and "," in value:
            raise InvalidRequest(
                f"Send one {header} header, without a comma: two of them arrive joined by "
                "commas, which cannot be told from one key holding a comma.", param=header,
                code="invalid_value")
