"""OpenAI's limits of a batch input file (50,000 requests, 200 MB; settings here made small)
answered with an error naming the limit, at upload and at batch creation, on the real
PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient

from domain.settings import Settings
from tests.app.flask_client import api_client, error_body, upload

pytestmark = pytest.mark.services

LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}\n'
MIB = 1 << 20


def _client(settings: Settings, **limits: Any) -> FlaskClient:
    return api_client(settings.model_copy(update=limits), team="limits")


def _stored(settings: Settings) -> list[str]:
    return sorted(p.name for p in settings.resolved_files_dir.iterdir() if p.name != ".tmp")


def test_an_upload_past_the_line_limit_is_refused(fresh_services: Settings) -> None:
    client = _client(fresh_services, max_batch_lines=3)
    assert upload(client, LINE * 3 + b"\n \n").status_code == 200  # blank lines do not count
    stored = _stored(fresh_services)
    error = error_body(upload(client, LINE * 4), 400)
    assert (error["param"], error["code"]) == ("file", "too_many_lines")
    assert "more than 3 requests" in error["message"] and "at most 3" in error["message"]
    assert _stored(fresh_services) == stored  # nothing kept of the refused file
    assert len(client.get("/v1/files").get_json()["data"]) == 1


def test_an_upload_at_the_size_limit_passes_the_body_limit(fresh_services: Settings) -> None:
    # The JSON body limit (1 MiB) does not apply to uploads: a file up to the batch input
    # limit passes, one byte more is refused with the limit named.
    client = _client(fresh_services, max_request_bytes=MIB, max_batch_file_bytes=3 * MIB)
    at_limit = LINE[:-1] + b" " * (3 * MIB - len(LINE)) + b"\n"
    created = upload(client, at_limit)
    assert created.status_code == 200, created.get_data(as_text=True)
    assert created.get_json()["bytes"] == 3 * MIB
    error = error_body(upload(client, at_limit + b"\n"), 413)
    assert error["code"] == "file_too_large" and str(3 * MIB) in error["message"]


def _create(client: FlaskClient, file_id: str) -> Any:
    return client.post("/v1/batches", json={"input_file_id": file_id,
                                            "endpoint": "/v1/completions",
                                            "completion_window": "24h"})


@pytest.mark.parametrize(("limits", "code", "named"), [
    ({"max_batch_lines": 2}, "too_many_lines", "at most 2 requests"),
    ({"max_batch_file_bytes": 100}, "file_too_large", "at most 100 bytes"),
])
def test_a_batch_on_a_file_past_a_limit_is_refused(fresh_services: Settings,
                                                   limits: dict[str, int], code: str,
                                                   named: str) -> None:
    """A file uploaded under higher limits (or limits lowered since) makes no batch."""
    file_id = upload(_client(fresh_services), LINE * 3).get_json()["id"]
    stricter = _client(fresh_services, **limits)
    error = error_body(_create(stricter, file_id), 400)
    assert (error["param"], error["code"]) == ("input_file_id", code)
    assert named in error["message"], error
    assert stricter.get("/v1/batches").get_json()["data"] == []
    assert _create(_client(fresh_services), file_id).status_code == 200
