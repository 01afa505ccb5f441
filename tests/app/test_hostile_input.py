"""Hostile request bodies, sent raw (bytes, not what a JSON encoder would write) to every endpoint
that takes JSON, on PostgreSQL: each gets a 4xx OpenAI error naming the problem, never a 5xx,
and nothing is written. What PostgreSQL refuses (NUL, lone surrogates, NaN) must be refused
before it reaches the database; 100,000 nested arrays before the parser recurses."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import func, select

from domain.models import (
    Batch,
    InferenceRequest,
    OperatorControl,
    OutboxEntry,
    RequestEvent,
    StoredFile,
)
from domain.settings import Settings
from domain.teams import ensure_team_key
from tests.app.flask_client import api_client, error_body, services_of, upload

pytestmark = pytest.mark.services

MODEL = "tiny-llama"
DEEP = b"[" * 100_000 + b"]" * 100_000
NUL, SURROGATE = "\\u0000", "\\ud800"  # JSON escapes, as they travel in a body


@pytest.fixture
def client(fresh_services: Settings) -> FlaskClient:
    return api_client(fresh_services)


def _bodies(client: FlaskClient) -> dict[str, str]:
    """A JSON template per endpoint (POST path -> body) with `@` where a hostile value goes."""
    file_id = upload(client).get_json()["id"]
    templates = {
        "/v1/requests": '{"prompt": "Hi", "metadata": {"k": @}}',
        "/v1/completions": '{"model": "MODEL", "prompt": "Hi", "max_tokens": 2, "stop": [@]}',
        "/v1/chat/completions": '{"model": "MODEL", "messages": [{"role": "user", '
                                '"content": @}]}',
        "/v1/batches": '{"input_file_id": "FILE", "endpoint": "/v1/completions", '
                       '"completion_window": "24h", "metadata": {"k": @}}',
    }
    return {path: body.replace("MODEL", MODEL).replace("FILE", file_id)
            for path, body in templates.items()}


def _post(client: FlaskClient, path: str, raw: bytes, **kwargs: Any) -> Any:
    kwargs.setdefault("content_type", "application/json")
    return client.post(path, data=raw, **kwargs)


def _refused(response: Any, status: int = 400) -> dict[str, Any]:
    error = error_body(response, status)
    assert error["type"] == "invalid_request_error" and error["message"], error
    return error


def _nothing_written(client: FlaskClient) -> None:
    with services_of(client).db.session() as session:
        for table in (InferenceRequest, RequestEvent, Batch, OutboxEntry, OperatorControl):
            assert session.scalar(select(func.count()).select_from(table)) == 0, table


def test_deep_nesting_is_refused_before_the_parser_recurses(client: FlaskClient) -> None:
    admin = {"Authorization": f"Bearer {_admin_key(client)}"}
    for path, template in _bodies(client).items():
        for raw in (DEEP, template.replace("@", "1").encode()[:-1] + b', "x": ' + DEEP + b"}",
                    template.replace("@", DEEP.decode()).encode()):
            error = _refused(_post(client, path, raw))
            assert error["code"] == "invalid_json" and "nested deeper than 64" in error["message"]
    error = _refused(client.put("/v1/admin/routing", data=b'{"policy": ' + DEEP + b"}",
                                content_type="application/json", headers=admin))
    assert "nested deeper" in error["message"]
    _nothing_written(client)


@pytest.mark.parametrize(("value", "problem"), [
    (f'"{SURROGATE}"', "lone surrogate (\\ud800)"),
    (f'"ok {SURROGATE} {NUL}"', "lone surrogate"),  # the first one is named
    ("NaN", "NaN is not a JSON number"),
    ("Infinity", "Infinity is not a JSON number"),
    ("-Infinity", "-Infinity is not a JSON number"),
    ("1e999", "out of range"),
])
def test_what_postgresql_cannot_store_is_named_with_its_path(
    client: FlaskClient, value: str, problem: str,
) -> None:
    params = {"/v1/requests": "metadata.k", "/v1/completions": "stop.0",
              "/v1/chat/completions": "messages.0.content", "/v1/batches": "metadata.k"}
    for path, template in _bodies(client).items():
        error = _refused(_post(client, path, template.replace("@", value).encode()))
        assert (error["code"], error["param"]) == ("invalid_value", params[path]), (path, error)
        assert problem in error["message"], error
    _nothing_written(client)


def test_surrogates_in_every_place_of_a_native_request(client: FlaskClient) -> None:
    cases = {
        f'{{"prompt": "{SURROGATE}"}}': "prompt",
        f'{{"messages": [{{"role": "user", "content": "{SURROGATE}x"}}]}}': "messages.0.content",
        f'{{"prompt": "x", "metadata": {{"{SURROGATE}": 1}}}}': "metadata.\\ud800",
        f'{{"prompt": "x", "stop": "{NUL}{SURROGATE}"}}': "stop",
    }
    for raw, param in cases.items():
        error = _refused(_post(client, "/v1/requests", raw.encode()))
        assert (error["code"], error["param"]) == ("invalid_value", param), (raw, error)
    _nothing_written(client)


def test_nul_round_trips_exactly_in_every_place_of_a_native_request(
    client: FlaskClient
) -> None:
    """vLLM's server takes NUL in a prompt; so does blockq, and gives back what it was given
    (PostgreSQL text cannot hold NUL: domain.models.ExactText escapes it, and a text that looks
    escaped already)."""
    prompt = "x\x00y\\0 \x01blockq-escaped:\x00"
    body = {"prompt": prompt, "metadata": {"k\x00": ["v", "\x00"]}, "stop": ["\x00"]}
    created = client.post("/v1/requests", json=body)
    assert created.status_code == 202, created.get_data(as_text=True)
    shown = client.get(f"/v1/requests/{created.get_json()['id']}").get_json()
    assert shown["metadata"] == body["metadata"]
    with services_of(client).db.session() as session:
        stored = session.get(InferenceRequest, created.get_json()["id"])
        assert stored is not None and (stored.prompt, stored.stop) == (prompt, ["\x00"])
    chat = client.post("/v1/requests", json={
        "messages": [{"role": "user", "content": "a\x00b"}]})
    assert chat.status_code == 202, chat.get_data(as_text=True)
    with services_of(client).db.session() as session:
        row = session.get(InferenceRequest, chat.get_json()["id"])
        assert row is not None and row.messages[0]["content"] == "a\x00b"
        assert "a\x00b" in row.prompt  # the rendered chat template keeps it too


def test_bodies_that_are_not_a_json_object(client: FlaskClient) -> None:
    cases = [
        (b"", "is empty"),
        (b"   \r\n", "is empty"),
        (b"[1, 2]", "must be a JSON object, not an array"),
        (b'"prompt"', "must be a JSON object, not a string"),
        (b"null", "must be a JSON object, not null"),
        (b"{not json", "is not valid JSON"),
        (b'{"prompt": "x"} trailing', "is not valid JSON: Extra data"),
        (b'{"prompt": "caf\xe9"}', "is not valid UTF-8 (byte 15)"),  # Latin-1, not UTF-8
        (b'{"prompt": "\xed\xa0\x80"}', "is not valid UTF-8"),  # a surrogate, UTF-8-encoded
        ('{"prompt": "x"}'.encode("utf-16"), "is not valid UTF-8"),
        (b'{"prompt": "tab\there"}', "Invalid control character"),
        (b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", "5000 digits is out of range"),
    ]
    for path in ("/v1/requests", "/v1/completions", "/v1/chat/completions", "/v1/batches"):
        for raw, problem in cases:
            error = _refused(_post(client, path, raw))
            assert problem in error["message"] and error["code"] in {"invalid_json",
                                                                      "invalid_value"}, error
    _nothing_written(client)


def test_a_content_type_other_than_json_gets_415(client: FlaskClient) -> None:
    for content_type in ("text/plain", "application/x-www-form-urlencoded",
                         "multipart/form-data; boundary=x"):
        error = _refused(_post(client, "/v1/requests", b'{"prompt": "x"}',
                               content_type=content_type), 415)
        assert error["code"] == "unsupported_media_type" and "application/json" in \
            error["message"]
    _nothing_written(client)
    for content_type in ("application/json; charset=utf-8", "application/vnd.api+json"):
        response = _post(client, "/v1/requests", b'{"prompt": "x"}', content_type=content_type)
        assert response.status_code == 202, response.get_data(as_text=True)
    # No Content-Type at all: read as JSON (curl --data-binary without -H sends a form type).
    response = client.post("/v1/requests", data=b'{"prompt": "x"}')
    assert response.status_code == 202, response.get_data(as_text=True)


def test_a_utf8_bom_and_crlf_are_accepted(client: FlaskClient) -> None:
    response = _post(client, "/v1/requests", b'\xef\xbb\xbf{"prompt": "Hi",\r\n"metadata": '
                     b'{"emoji": "\\ud83d\\ude00"}}\r\n')
    assert response.status_code == 202, response.get_data(as_text=True)
    shown = client.get(f"/v1/requests/{response.get_json()['id']}").get_json()
    assert shown["metadata"] == {"emoji": "\U0001f600"}  # a surrogate *pair* is one character


def test_bodies_at_and_past_the_size_limit(fresh_services: Settings) -> None:
    limit = 4096
    client = api_client(fresh_services.model_copy(update={"max_request_bytes": limit}))
    head, tail = b'{"prompt": "Hi", "max_tokens": 2, "metadata": {"pad": "', b'"}}'
    at_limit = head + b"x" * (limit - len(head) - len(tail)) + tail
    assert len(at_limit) == limit
    assert _post(client, "/v1/requests", at_limit).status_code == 202
    for path in ("/v1/requests", "/v1/completions", "/v1/chat/completions", "/v1/batches"):
        error = _refused(_post(client, path, at_limit[:-1] + b" }"), 413)
        assert error["code"] == "request_too_large" and f"larger than {limit} bytes" in \
            error["message"], error
    with services_of(client).db.session() as session:
        assert session.scalar(select(func.count()).select_from(InferenceRequest)) == 1


def test_admin_routing_reads_its_body_the_same_way(client: FlaskClient) -> None:
    admin = {"Authorization": f"Bearer {_admin_key(client)}"}
    for raw, problem in [(b"", "is empty"), (b'{"policy": NaN}', "NaN"),
                         (f'{{"policy": "{SURROGATE}"}}'.encode(), "surrogate"),
                         (b"[]", "not an array"), (b"\xff", "UTF-8")]:
        error = _refused(client.put("/v1/admin/routing", data=raw, headers=admin,
                                    content_type="application/json"))
        assert problem in error["message"], error
    error = _refused(client.put("/v1/admin/routing", data=json.dumps({"policy": "nope"}),
                                headers=admin, content_type="application/json"))
    assert error["code"] == "unknown_policy"
    _nothing_written(client)


def _admin_key(client: FlaskClient) -> str:
    with services_of(client).db.session() as session:
        return ensure_team_key(session, "ops", is_admin=True).key


def _multipart(disposition: bytes, content: bytes) -> bytes:
    """A raw multipart body: the purpose part and a file part with `disposition` verbatim."""
    return (b'--B\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b'--B\r\nContent-Disposition: form-data; name="file"; ' + disposition +
            b"\r\nContent-Type: application/octet-stream\r\n\r\n" + content + b"\r\n--B--\r\n")


def _upload_raw(client: FlaskClient, disposition: bytes, content: bytes = b"{}\n") -> Any:
    return client.post("/v1/files", data=_multipart(disposition, content),
                       content_type="multipart/form-data; boundary=B")


def test_hostile_file_names_and_sizes(fresh_services: Settings) -> None:
    limit = 4096
    client = api_client(fresh_services.model_copy(update={"max_file_bytes": limit}))
    refused = {
        b'filename="a\x00b.jsonl"': "U+0000",
        b"filename*=UTF-8''a%00b.jsonl": "U+0000",
        b"filename*=UTF-8''in%0D%0AX-Injected: 1.jsonl": "U+000D",
        b"filename*=UTF-8''tab%09.jsonl": "U+0009",
        b"filename*=UTF-8''c1%C2%85.jsonl": "U+0085",
        b'filename="' + b"n" * 256 + b'"': "256 characters; at most 255",
        b'filename=".."': "needs a 'file' part with a file name",
        b"filename*=UTF-8''dir%2F..": "needs a 'file' part with a file name",
    }
    for disposition, problem in refused.items():
        error = _refused(_upload_raw(client, disposition))
        assert error["param"] == "file" and problem in error["message"], (disposition, error)
    kept = {
        b"filename*=UTF-8''..%2F..%2Fetc%2Fpasswd": "passwd",  # the directories are dropped
        b'filename="..\\\\..\\\\win.jsonl"': "win.jsonl",
        b"filename*=UTF-8''caf%C3%A9.jsonl": "caf\u00e9.jsonl",
        b'filename="' + b"n" * 255 + b'"': "n" * 255,
    }
    for disposition, name in kept.items():
        response = _upload_raw(client, disposition)
        assert response.status_code == 200 and response.get_json()["filename"] == name, (
            disposition, response.get_data(as_text=True))
    # Sizes: empty, at the file limit, one past it, past the whole body's limit.
    assert _refused(_upload_raw(client, b'filename="e.jsonl"', b""))["code"] == "empty_file"
    at_limit = _upload_raw(client, b'filename="full.jsonl"', b"x" * (limit - 1) + b"\n")
    assert at_limit.status_code == 200 and at_limit.get_json()["bytes"] == limit
    over = _refused(_upload_raw(client, b'filename="big.jsonl"', b"x" * limit + b"\n"), 413)
    assert over["code"] == "file_too_large" and str(limit) in over["message"]
    huge = _refused(_upload_raw(client, b'filename="huge.jsonl"', b"x" * 200_000), 413)
    assert huge["code"] == "request_too_large" and "larger than" in huge["message"]
    with services_of(client).db.session() as session:
        rows = session.execute(select(StoredFile.id, StoredFile.filename)).all()
    assert sorted(row.filename for row in rows) == sorted([*kept.values(), "full.jsonl"])
    files_dir = services_of(client).settings.resolved_files_dir  # no bytes left of a refusal
    assert sorted(p.name for p in files_dir.iterdir() if p.is_file()) == sorted(
        row.id for row in rows)


def test_nul_in_the_url_path_query_and_idempotency_key(client: FlaskClient) -> None:
    """Outside the body: a lookup by id, a cursor or a filter holding NUL failed its query."""
    batch_id = client.post("/v1/batches", json={
        "input_file_id": upload(client).get_json()["id"], "endpoint": "/v1/completions",
        "completion_window": "24h"}).get_json()["id"]
    for method, url in [("get", "/v1/requests/req_%00"), ("post", "/v1/requests/req_%00/cancel"),
                        ("get", "/v1/files/file-%00"), ("get", "/v1/files/file-%00/content"),
                        ("delete", "/v1/files/file-%00"), ("get", "/v1/batches/batch_%00"),
                        ("post", "/v1/batches/batch_%00/cancel")]:
        error = _refused(getattr(client, method)(url))
        assert error["code"] == "invalid_path" and "NUL character" in error["message"], url
    for url, param in [("/v1/files?after=%00", "after"), ("/v1/files?purpose=a%00", "purpose"),
                       ("/v1/batches?after=batch_%00", "after"), ("/v1/files?%00=1", "\\u0000")]:
        error = _refused(client.get(url))
        assert (error["code"], error["param"]) == ("invalid_value", param), url
    error = _refused(client.post("/v1/requests", json={"prompt": "x"},
                                 headers={"Idempotency-Key": "k\x00"}))
    assert error["param"] == "Idempotency-Key" and "NUL character" in error["message"]
    assert client.get(f"/v1/batches/{batch_id}").status_code == 200
    with services_of(client).db.session() as session:
        assert session.scalar(select(func.count()).select_from(InferenceRequest)) == 0
