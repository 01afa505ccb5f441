"""Property-based fuzzing of the API against its OpenAPI document (schemathesis), in-process on
PostgreSQL with two teams: no 5xx, every answer as documented, every endpoint refuses a missing
or wrong key, another team's objects are not found, and the documented links hold."""

from __future__ import annotations

import io
import os
import re
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.api.services import services
from domain.settings import Settings
from domain.teams import ensure_team_key, revoke_key, team_by_name
from tests.app.api_fuzz import (
    WAITING_OPERATIONS,
    Known,
    engine_stand_in,
    fuzz_links,
    fuzz_operations,
)
from tests.app.flask_client import JSONL, api_client, error_body
from tests.engine_states import engine_state

#: Cases per operation and generation mode (positive, negative); scripts/fuzz_api.py runs more.
EXAMPLES = int(os.environ.get("BLOCKQ_FUZZ_EXAMPLES", "45"))
LINK_RUNS = int(os.environ.get("BLOCKQ_FUZZ_LINK_RUNS", "30"))


@dataclass(frozen=True)
class Fuzzed:
    app: Flask
    alpha: dict[str, str]  # an admin key's headers
    beta: dict[str, str]
    client: FlaskClient

    def objects(self, headers: dict[str, str]) -> dict[str, str]:
        """A new request, input file and batch of the key's team: their ids by path parameter."""
        request = self.client.post("/v1/requests", json={"prompt": "hi", "max_tokens": 2},
                                   headers=headers)
        file_id = self.new_file(headers)
        batch = self.client.post("/v1/batches", headers=headers, json={
            "input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"})
        assert request.status_code == 202 and batch.status_code == 200, batch.text
        return {"request_id": request.json["id"], "file_id": file_id,
                "batch_id": batch.json["id"]}

    def new_file(self, headers: dict[str, str]) -> str:
        response = self.client.post("/v1/files", headers=headers, data={
            "purpose": "batch", "file": (io.BytesIO(JSONL), "in.jsonl")})
        assert response.status_code == 200, response.text
        return response.json["id"]

    def known(self) -> Known:
        """Alpha's objects, and an engine instance published as a worker would."""
        ids = self.objects(self.alpha)
        with self.app.app_context():
            svc = services()
            svc.fleet.publish("gpu.0", engine_state())
            with svc.db.session() as session:
                team_id = team_by_name(session, "alpha").id
        return Known(model=svc.settings.model_name, new_file=lambda: self.new_file(self.alpha),
                     new_request=lambda: self.new_request(self.alpha), instance_id="gpu.0",
                     team_id=team_id, **ids)

    def new_request(self, headers: dict[str, str]) -> str:
        response = self.client.post("/v1/requests", json={"prompt": "hi", "max_tokens": 2},
                                    headers=headers)
        assert response.status_code == 202, response.text
        return response.json["id"]


@pytest.fixture
def fuzzed(fresh_services: Settings) -> Iterator[Fuzzed]:
    """The API on a fresh database; no rate limit in the way, and a short sync timeout."""
    settings = fresh_services.model_copy(update={"rate_limit_rpm": 10_000_000,
                                                 "sync_timeout_s": 5.0})
    app = create_app(settings)  # NOTE: not testing: an exception is a 500, as in production
    with app.app_context(), services().db.session() as session:
        alpha = ensure_team_key(session, "alpha", is_admin=True).key
        beta = ensure_team_key(session, "beta").key
    yield Fuzzed(app, {"Authorization": f"Bearer {alpha}"}, {"Authorization": f"Bearer {beta}"},
                 app.test_client())


def _around(app: Flask) -> Any:
    return lambda label: engine_stand_in(app) if label in WAITING_OPERATIONS else nullcontext()


@pytest.mark.slow
def test_fuzz_every_operation_and_the_links(fuzzed: Fuzzed) -> None:
    started = time.monotonic()
    result = fuzz_operations(fuzzed.app, fuzzed.alpha, fuzzed.known(), examples=EXAMPLES,
                             around=_around(fuzzed.app))
    fuzz_links(fuzzed.app, fuzzed.alpha, steps=LINK_RUNS, result=result)
    print(f"\n{result.table()}\n{result.total} cases in {time.monotonic() - started:.0f} s")
    assert result.total >= 2_000 or EXAMPLES < 45
    failures = "\n\n".join(f"{label}:\n" + "\n".join(found[:2])
                             for label, found in result.failures.items())
    assert not failures, failures


def test_a_sync_completion_without_an_engine_is_the_documented_504(
        fresh_services: Settings) -> None:
    """What the fuzz run avoids with its engine stand-in: no engine answers, the wait ends at
    `sync_timeout_s` with a documented 504 error object (the request goes on)."""
    client = api_client(fresh_services.model_copy(update={"sync_timeout_s": 0.5}))
    response = client.post("/v1/completions", json={
        "model": fresh_services.model_name, "prompt": "hi", "max_tokens": 2})
    assert error_body(response, 504)["code"] == "timeout"
    documented = {path: operation for _, path, operation in _documented(client)}
    assert "504" in documented["/v1/completions"]["responses"]


def test_a_seed_past_the_database_integer_is_a_400_naming_it(fuzzed: Fuzzed) -> None:
    """Found by the fuzz run: seed 2**63 - 1 was accepted and failed the insert (500)."""
    client, headers = fuzzed.client, fuzzed.alpha
    with fuzzed.app.app_context():
        model = services().settings.model_name
    for path, body in (("/v1/requests", {"prompt": "hi"}),
                       ("/v1/completions", {"model": model, "prompt": "hi"}),
                       ("/v1/chat/completions", {"model": model,
                                                 "messages": [{"role": "user", "content": "hi"}]})):
        for seed in (2**31, 2**63 - 1):
            error = error_body(client.post(path, headers=headers, json={**body, "seed": seed}), 400)
            assert error["param"] == "seed" and "2147483648" in error["message"], error
    accepted = client.post("/v1/requests", headers=headers,
                           json={"prompt": "hi", "seed": 2**31 - 1})
    assert accepted.status_code == 202, accepted.text


def _documented(client: FlaskClient) -> list[tuple[str, str, dict[str, Any]]]:
    document = client.get("/openapi.json").json
    return [(method.upper(), path, operation) for path, item in document["paths"].items()
            for method, operation in item.items()]


def _send(client: FlaskClient, method: str, url: str, headers: dict[str, str]) -> Any:
    body = {"json": {}} if method in ("POST", "PUT") else {}
    return client.open(url, method=method, headers=headers, **body)


def test_every_endpoint_refuses_a_missing_or_wrong_key(fuzzed: Fuzzed) -> None:
    with fuzzed.app.app_context(), services().db.session() as session:
        revoked = ensure_team_key(session, "beta")
        revoke_key(session, revoked.key_id)
    refusals = {"missing_api_key": [{}, {"Authorization": "Basic YTpi"},
                                    {"Authorization": "Bearer "}],
                "invalid_api_key": [{"Authorization": "Bearer bq-not-a-key"},
                                    {"Authorization": f"Bearer {revoked.key}"}]}
    checked = 0
    for method, path, operation in _documented(fuzzed.client):
        if operation.get("security") == []:
            continue
        url = re.sub(r"\{[^}]+\}", "x", path)
        for code, headers_list in refusals.items():
            for headers in headers_list:
                assert error_body(_send(fuzzed.client, method, url, headers), 401)["code"] == code
                checked += 1
    assert checked >= 5 * 20


def test_another_teams_objects_are_not_found_and_admin_needs_an_admin_key(
        fuzzed: Fuzzed) -> None:
    """Every operation on a request, file or batch, asked by another team: 404, and nothing
    changes; the objects stay out of that team's lists."""
    theirs = fuzzed.objects(fuzzed.beta)
    fuzzed.objects(fuzzed.alpha)
    tried = 0
    for method, path, _ in _documented(fuzzed.client):
        names = re.findall(r"\{([^}]+)\}", path)
        if names and all(name in theirs for name in names):
            url = path.format(**theirs)
            assert error_body(_send(fuzzed.client, method, url, fuzzed.alpha), 404)
            tried += 1
        if path.startswith("/v1/admin/"):
            url = re.sub(r"\{[^}]+\}", "x", path)
            error = error_body(_send(fuzzed.client, method, url, fuzzed.beta), 403)
            assert error["code"] == "admin_only"
    assert tried >= 7
    client = fuzzed.client
    assert client.get(f"/v1/requests/{theirs['request_id']}",
                      headers=fuzzed.beta).json["status"] == "queued"
    assert client.get(f"/v1/files/{theirs['file_id']}/content",
                      headers=fuzzed.beta).data == JSONL
    assert client.get(f"/v1/batches/{theirs['batch_id']}",
                      headers=fuzzed.beta).json["status"] == "validating"
    listed = {obj["id"] for path in ("/v1/files", "/v1/batches")
              for obj in client.get(path, headers=fuzzed.alpha).json["data"]}
    assert listed and not listed & set(theirs.values())


def _follow(expression: str, body: dict[str, Any]) -> Any:
    """A link's value: `$response.body#/<pointer>` read from the source's answer."""
    if not expression.startswith("$response.body#/"):
        return expression
    value: Any = body
    for part in expression.removeprefix("$response.body#/").split("/"):
        value = value[part]
    return value


def test_every_documented_link_leads_to_a_working_call(fuzzed: Fuzzed) -> None:
    """File -> batch -> file, request -> cancel: each link of the document, followed with the
    source's real answer, gets a 2xx (a batch's output file once it exists: none without
    workers, so that one link must find nothing yet)."""
    client, headers = fuzzed.client, fuzzed.alpha
    documented = {op["operationId"]: (method, path)
                  for method, path, op in _documented(client)}
    sources = {
        "files_upload": lambda: client.post("/v1/files", headers=headers, data={
            "purpose": "batch", "file": (io.BytesIO(JSONL), "in.jsonl")}),
        "requests_create": lambda: client.post("/v1/requests", headers=headers,
                                               json={"prompt": "hi", "max_tokens": 2}),
        "batches_create": lambda: client.post("/v1/batches", headers=headers, json={
            "input_file_id": fuzzed.new_file(headers), "endpoint": "/v1/completions",
            "completion_window": "24h"}),
        "requests_cancel": lambda: client.post(
            f"/v1/requests/{fuzzed.objects(headers)['request_id']}/cancel", headers=headers),
        "batches_show": lambda: client.get(
            f"/v1/batches/{fuzzed.objects(headers)['batch_id']}", headers=headers),
    }
    followed = []
    for _, _, operation in _documented(client):
        for status, response in operation["responses"].items():
            for name, link in response.get("links", {}).items():
                source = sources[operation["operationId"]]()
                assert source.status_code == int(status), source.text
                target_method, target_path = documented[link["operationId"]]
                params = {k: _follow(v, source.json) for k, v in link.get("parameters", {}).items()}
                body = link.get("requestBody")
                body = {k: _follow(v, source.json) for k, v in body.items()} if body else None
                if None in params.values():
                    assert name == "GetOutputFile" and source.json["status"] == "validating"
                    continue
                answer = client.open(target_path.format(**params), method=target_method,
                                     headers=headers, json=body)
                assert answer.status_code < 300, (name, answer.text)
                followed.append(name)
    assert {"CreateBatch", "GetFileContent", "CancelRequest", "CancelBatch"} <= set(followed)
