"""The model of a batch, checked at creation: every line's body names the same served model
(OpenAI's rule: one model per batch), and it is one the fleet serves; else a 400 naming the line.

Lines that are not JSON objects with a body naming a model are left to expansion, which reports
each such line in the error file (workers/batch/lines.py); only the model is checked here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import IO

from domain.errors import InvalidRequest

__all__ = ["batch_model"]


def batch_model(open_file: Callable[[], IO[bytes]], is_served: Callable[[str], bool]
                ) -> str | None:
    """The model the input file's lines name (None: no line names one), or a 400 naming the
    first line (1-based, blank lines counted) that names another model than the first, or a
    model that `is_served` says no instance serves."""
    model: str | None = None
    first = 0  # the line that named it
    with open_file() as handle:
        for number, raw in enumerate(handle, start=1):
            named = _named_model(raw)
            if named is None:
                continue
            if model is None:
                if not is_served(named):
                    raise InvalidRequest(
                        f"Line {number} of the input file names the model '{named}', which no "
                        "instance serves (GET /v1/models lists those up).",
                        param="input_file_id", code="model_not_found")
                model, first = named, number
            elif named != model:
                raise InvalidRequest(
                    f"Line {number} of the input file names the model '{named}', but line "
                    f"{first} names '{model}': a batch runs on one model.",
                    param="input_file_id", code="mixed_models")
    return model


def _named_model(raw: bytes) -> str | None:
    if not raw.strip():
        return None
    try:
        line = json.loads(raw)
    except ValueError:
        return None
    body = line.get("body") if isinstance(line, dict) else None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) and model else None

