"""The OpenAPI document: every route in it, valid OpenAPI 3.1, served without a key with a page
for people, and the OpenAI response builders conform to its models."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
from flask.testing import FlaskClient
from openapi_spec_validator import validate
from pydantic import BaseModel

from app.api import contract
from app.api.openapi import openapi_path
from domain import openai_format as fmt
from domain.models import InferenceRequest
from domain.settings import Settings
from tests.app.flask_client import api_client

METHODS_IGNORED = {"HEAD", "OPTIONS"}


@pytest.fixture
def client(fresh_services: Settings) -> FlaskClient:
    return api_client(fresh_services)


@pytest.fixture
def document(client: FlaskClient) -> dict[str, Any]:
    client.environ_base.pop("HTTP_AUTHORIZATION")
    response = client.get("/openapi.json")
    assert response.status_code == 200
    return response.get_json()


def test_every_route_is_documented(client: FlaskClient, document: dict[str, Any]) -> None:
    """A route added without an entry in app.api.openapi.OPERATIONS fails here."""
    missing = []
    for rule in client.application.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        item = document["paths"].get(openapi_path(rule.rule), {})
        missing += [f"{method} {rule.rule} ({rule.endpoint})"
                    for method in sorted((rule.methods or set()) - METHODS_IGNORED)
                    if method.lower() not in item]
    assert not missing, f"routes missing from the OpenAPI document: {missing}"


def test_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1")
    validate(document)  # raises on any violation of the OpenAPI 3.1 schema


def test_every_error_answer_is_the_error_object(document: dict[str, Any]) -> None:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            statuses = set(operation["responses"])
            for status, response in operation["responses"].items():
                if int(status) >= 400 and not (path == "/readyz" and status == "503"):
                    assert response.get("$ref") == "#/components/responses/Error", (
                        method, path, status)
            if operation.get("security") != []:
                assert {"401", "429", "503"} <= statuses, (method, path)
            if "{" in path:
                assert "404" in statuses, (method, path)


def test_auth_sse_multipart_and_links_are_described(document: dict[str, Any]) -> None:
    scheme = document["components"]["securitySchemes"]["bearerAuth"]
    assert scheme == {**scheme, "type": "http", "scheme": "bearer"}
    assert document["security"] == [{"bearerAuth": []}]
    paths = document["paths"]
    assert paths["/healthz"]["get"]["security"] == []
    for path, chunk in (("/v1/completions", "CompletionChunk"),
                        ("/v1/chat/completions", "ChatCompletionChunk")):
        content = paths[path]["post"]["responses"]["200"]["content"]
        assert content["text/event-stream"]["x-event-data"]["$ref"].endswith(chunk)
    upload = paths["/v1/files"]["post"]["requestBody"]["content"]
    assert list(upload) == ["multipart/form-data"]
    links = paths["/v1/files"]["post"]["responses"]["200"]["links"]
    assert links["CreateBatch"]["requestBody"]["input_file_id"] == "$response.body#/id"
    assert set(paths["/v1/requests"]["post"]["responses"]["202"]["links"]) == {
        "GetRequest", "CancelRequest"}


def test_request_bodies_are_the_models_the_endpoints_parse_with(
        document: dict[str, Any]) -> None:
    """The document takes the request models' own schemas: a parameter added to a model
    appears in the document with no other change."""
    schemas = document["components"]["schemas"]
    for name, model_name in (("/v1/completions", "CompletionBody"),
                             ("/v1/chat/completions", "ChatCompletionBody"),
                             ("/v1/requests", "CreateRequest"), ("/v1/batches", "CreateBatch")):
        body = document["paths"][name]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"]["$ref"] == f"#/components/schemas/{model_name}"
    from domain.openai_schemas import CompletionBody  # noqa: PLC0415
    assert set(schemas["CompletionBody"]["properties"]) == set(CompletionBody.model_fields)
    assert schemas["CompletionBody"]["additionalProperties"] is False


def test_docs_page_is_rendered_here_and_fetches_nothing(client: FlaskClient,
                                                        document: dict[str, Any]) -> None:
    client.environ_base.pop("HTTP_AUTHORIZATION", None)
    response = client.get("/docs")
    assert response.status_code == 200 and response.mimetype == "text/html"
    page = response.get_data(as_text=True)
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "an external resource"
    for path, item in document["paths"].items():
        for operation in item.values():
            assert f'id="{operation["operationId"]}"' in page
            assert f"<code>{path}</code>" in page
    assert 'id="ErrorResponse"' in page


def _finished_request() -> InferenceRequest:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    return InferenceRequest(id="req_" + "a" * 32, status="succeeded", prompt_tokens=5,
                            output_tokens=3, output_text="hi!", finish_reason="length",
                            created_at=now)


@pytest.mark.parametrize(("render", "model"), [
    (lambda r: fmt.completion_object(r, "m"), contract.CompletionObject),
    (lambda r: fmt.chat_completion_object(r, "m"), contract.ChatCompletionObject),
    (lambda r: fmt.completion_chunk(r, "m", "x", None), contract.CompletionChunk),
    (lambda r: fmt.completion_chunk(r, "m", "", "stop"), contract.CompletionChunk),
    (lambda r: fmt.chat_chunk(r, "m", {"role": "assistant", "content": ""}, None),
     contract.ChatCompletionChunk),
    (lambda r: fmt.chat_chunk(r, "m", {}, "length"), contract.ChatCompletionChunk),
])
def test_openai_objects_conform_to_the_document(render: Any, model: type[BaseModel]) -> None:
    """The OpenAI objects the fuzz run reaches only with an engine: drift fails here."""
    model.model_validate(render(_finished_request()))
