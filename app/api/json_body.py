"""The one reader of JSON request bodies: every endpoint that takes JSON calls `json_body()`."""

from __future__ import annotations

from typing import Any

from flask import request

from domain.errors import UnsupportedMediaType
from domain.json_input import parse_json_object

__all__ = ["json_body"]


def json_body() -> dict[str, Any]:
    """The request's JSON object, checked by `domain.json_input` (depth, NaN, NUL, surrogates,
    UTF-8); a 400 naming the problem otherwise. A body larger than the app's limit is a 413
    (raised by Werkzeug while reading). A request without a Content-Type is read as JSON; one
    with another type (a form, text) gets a 415."""
    if request.content_type and not request.is_json:
        raise UnsupportedMediaType(f"The Content-Type must be application/json, not "
                                   f"'{request.mimetype}'.", code="unsupported_media_type")
    return parse_json_object(request.get_data(cache=True))
