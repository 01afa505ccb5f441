"""The OpenAPI 3.1 document of the API, built from the live app: its routes (`app.url_map`), the
request models the endpoints parse with and the response models of `app.api.contract`; served
at GET /openapi.json, and as a page for people at GET /docs (rendered here, no script).

Each route's operation is described once, in OPERATIONS, by its endpoint name; a route without
an entry is left out of the document, and tests/app/test_openapi.py fails on it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from flask import Blueprint, Flask, current_app, jsonify, render_template_string
from flask.typing import ResponseReturnValue
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from app.api import contract as c
from app.api.batches import MAX_LIST_LIMIT as MAX_BATCH_LIST_LIMIT
from app.api.files import MAX_LIST_LIMIT as MAX_FILE_LIST_LIMIT
from domain.batches import CreateBatch
from domain.commands import MAX_IDEMPOTENCY_KEY_LEN
from domain.openai_schemas import ChatCompletionBody, CompletionBody
from domain.schemas import CreateRequest
from domain.sessions import MAX_SESSION_ID_LEN, SESSION_HEADER
from domain.slo import E2E_HEADER, MAX_TARGET_MS, MIN_TARGET_MS, TTFT_HEADER

__all__ = ["bp", "OPERATIONS", "build_document", "openapi_path"]

bp = Blueprint("openapi", __name__)

ERROR_REF = "#/components/responses/Error"
SCHEMA_REF = "#/components/schemas/{model}"

#: What every authenticated call may get: a missing or wrong key, the team's rate limit, and
#: the database or broker restarting.
AUTH_ERRORS = (401, 429, 503)

_DESCRIPTIONS = {
    400: "Bad input: the message names the parameter and the problem.",
    401: "Missing or unknown API key.",
    403: "Not allowed: the key is not an admin key, or the team's storage quota is full.",
    404: "No such object for this team (another team's objects are not found either).",
    409: "The object is in a state that does not allow this.",
    413: "The body is larger than the limit.",
    415: "The body is not JSON (a form, text).",
    422: "The request cannot be served (e.g. prompt longer than the model's context).",
    429: "The team's rate limit, or its cap on held completions, is reached, or (code "
         "slo_unmeetable) no instance can meet the call's latency targets and the team refuses "
         "such calls; retry later (Retry-After).",
    503: "The database or the broker is unavailable, no worker answered, or the API process "
         "has no thread to spare; retry shortly.",
    504: "The request did not finish within the sync timeout; it goes on "
         "(GET /v1/requests/{id}).",
}


@dataclass(frozen=True)
class Param:
    name: str
    where: Literal["query", "header"]
    schema: dict[str, Any]
    description: str = ""


@dataclass(frozen=True)
class Operation:
    """One route's contract. `response` is the model of the success body, or a media type for
    a body that is not JSON; `errors` the error statuses besides AUTH_ERRORS."""

    summary: str
    tag: str
    response: type[BaseModel] | str
    status: int = 200
    body: type[BaseModel] | None = None
    multipart: bool = False
    errors: tuple[int, ...] = ()
    params: tuple[Param, ...] = ()
    open: bool = False  # no API key needed
    stream: type[BaseModel] | None = None  # text/event-stream `data:` events of `stream: true`
    other: dict[int, type[BaseModel]] = field(default_factory=dict)  # non-error bodies
    links: dict[str, dict[str, Any]] = field(default_factory=dict)
    description: str = ""


def _page_params(max_limit: int, *, orders: tuple[str, ...] = ("desc",)) -> tuple[Param, ...]:
    return (
        Param("after", "query", {"type": "string"}, "List after the object with this id."),
        Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": max_limit},
              "How many objects at most."),
        Param("order", "query", {"type": "string", "enum": list(orders)},
              "By creation time."),
    )


def _link(operation_id: str, **parameters: str) -> dict[str, Any]:
    return {"operationId": operation_id, "parameters": parameters}


_BODY_ID = "$response.body#/id"
_TARGET_MS = {"type": "string", "pattern": r"^[0-9]{1,9}(\.[0-9]{1,6})?$"}
#: Latency targets as headers of the OpenAI-compatible calls (or the body's `slo`).
SLO_PARAMS = (
    Param(TTFT_HEADER, "header", _TARGET_MS,
          f"Time-to-first-token target, milliseconds from acceptance ({MIN_TARGET_MS:g} to "
          f"{MAX_TARGET_MS:g}), as slo.ttft_ms."),
    Param(E2E_HEADER, "header", _TARGET_MS,
          "End-to-end latency target, milliseconds from acceptance, as slo.e2e_ms."),
)
#: The conversation a request belongs to (session affinity, domain/sessions.py).
SESSION_PARAM = Param(
    SESSION_HEADER, "header",
    {"type": "string", "minLength": 1, "maxLength": MAX_SESSION_ID_LEN,
     "pattern": "^[!-~]([ -~]*[!-~])?$"},
    "The conversation this request belongs to: its turns go to the instance that served the "
    "previous one while that instance has room (on the OpenAI calls, `user` names it when "
    "this header is absent).")
ADMIN = "Operations (admin keys only)"

#: A completion's Idempotency-Key: a retried call joins the first one's requests.
COMPLETION_KEY_PARAM = Param(
    "Idempotency-Key", "header",
    {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY_LEN, "pattern": "^[^,]*$"},
    "Calling again with the same key and body joins the first call's requests: a running one "
    "is waited for, a finished one answered at once, a stream replayed from its first token; "
    "a cancelled one starts again. Another body: 409. One header, without a comma.")

OPERATIONS: dict[str, Operation] = {
    # --- native requests
    "requests.create": Operation(
        "Submit a request", "Requests", c.SubmittedRequest, status=202, body=CreateRequest,
        errors=(400, 404, 409, 413, 422),
        params=(Param("Idempotency-Key", "header",
                      {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY_LEN,
                       "pattern": "^[^,]*$"},
                      "Submitting again with the same key returns the first request. One "
                      "header, without a comma (two are refused: they arrive joined by one)."),
                SESSION_PARAM),
        links={"GetRequest": _link("requests_show", request_id=_BODY_ID),
               "CancelRequest": _link("requests_cancel", request_id=_BODY_ID)},
        description="Queued at once; predicted, routed and run by the workers. Poll "
                    "`status_url`, or give `webhook_url`."),
    "requests.show": Operation("Show a request", "Requests", c.RequestObject, errors=(404,)),
    "requests.cancel": Operation(
        "Cancel a request", "Requests", c.RequestObject, errors=(404, 409),
        links={"GetRequest": _link("requests_show", request_id=_BODY_ID)}),
    # --- OpenAI-compatible
    "openai.list_models": Operation("List models", "OpenAI-compatible", c.ModelList),
    "openai.show_model": Operation("Show a model", "OpenAI-compatible", c.ModelObject,
                                   errors=(404,)),
    "openai.completions": Operation(
        "Create a completion", "OpenAI-compatible", c.CompletionObject, body=CompletionBody,
        stream=c.CompletionChunk, errors=(400, 404, 409, 413, 422, 504),
        params=(*SLO_PARAMS, SESSION_PARAM, COMPLETION_KEY_PARAM),
        description="Waits for the answer; with `stream: true`, server-sent events as the text "
                    "is generated, ended by `data: [DONE]`."),
    "openai.chat_completions": Operation(
        "Create a chat completion", "OpenAI-compatible", c.ChatCompletionObject,
        body=ChatCompletionBody, stream=c.ChatCompletionChunk,
        errors=(400, 404, 409, 413, 422, 504),
        params=(*SLO_PARAMS, SESSION_PARAM, COMPLETION_KEY_PARAM),
        description="As /v1/completions, with messages rendered by the model's chat template."),
    # --- files
    "files.upload": Operation(
        "Upload a file", "Files", c.FileObject, body=c.FileUpload, multipart=True,
        errors=(400, 403, 413),
        links={"GetFile": _link("files_show", file_id=_BODY_ID),
               "GetFileContent": _link("files_content", file_id=_BODY_ID),
               "DeleteFile": _link("files_delete", file_id=_BODY_ID),
               "CreateBatch": {"operationId": "batches_create", "requestBody": {
                   "input_file_id": _BODY_ID, "endpoint": "/v1/chat/completions",
                   "completion_window": "24h"}}}),
    "files.index": Operation(
        "List files", "Files", c.FileList, errors=(400,),
        params=(*_page_params(MAX_FILE_LIST_LIMIT, orders=("desc", "asc")),
                Param("purpose", "query", {"type": "string"}, "Only files of this purpose."))),
    "files.show": Operation("Show a file", "Files", c.FileObject, errors=(404,)),
    "files.content": Operation("Download a file's content", "Files", "application/octet-stream",
                               errors=(404,)),
    "files.delete": Operation("Delete a file", "Files", c.FileDeleted, errors=(404,)),
    # --- batches
    "batches.create": Operation(
        "Create a batch", "Batches", c.BatchObject, body=CreateBatch, errors=(400, 413),
        links={"GetBatch": _link("batches_show", batch_id=_BODY_ID),
               "CancelBatch": _link("batches_cancel", batch_id=_BODY_ID)},
        description="Reads the input file (purpose `batch`, one request per line) and runs "
                    "its lines within the completion window."),
    "batches.index": Operation("List batches", "Batches", c.BatchList, errors=(400,),
                               params=_page_params(MAX_BATCH_LIST_LIMIT)[:2]),
    "batches.show": Operation(
        "Show a batch", "Batches", c.BatchObject, errors=(404,),
        links={"GetOutputFile": _link("files_content",
                                      file_id="$response.body#/output_file_id")}),
    "batches.cancel": Operation(
        "Cancel a batch", "Batches", c.BatchObject, errors=(404, 409),
        description="Lines not released are withdrawn, those in flight cancelled."),
    # --- instances and operations
    "instances.list_instances": Operation("List engine instances", "Instances",
                                          c.InstanceList),
    "admin.show_queues": Operation("Queue depths", ADMIN, c.QueuesObject, errors=(403,)),
    "admin.drain": Operation("Drain an instance", ADMIN, c.InstanceControl, errors=(403, 404)),
    "admin.pause": Operation("Pause an instance", ADMIN, c.InstanceControl, errors=(403, 404)),
    "admin.resume": Operation("Resume an instance", ADMIN, c.InstanceControl,
                              errors=(403, 404)),
    "admin.show_routing": Operation("Routing in force", ADMIN, c.RoutingState, errors=(403,)),
    "admin.switch_routing": Operation(
        "Switch the routing policy", ADMIN, c.RoutingState, body=c.RoutingPolicyBody,
        errors=(400, 403, 413)),
    "admin.show_team": Operation("Show a team's settings", ADMIN, c.TeamObject,
                                 errors=(403, 404)),
    "admin.update_team": Operation(
        "Change a team's settings", ADMIN, c.TeamObject, body=c.TeamSettingsBody,
        errors=(400, 403, 404, 413),
        description="`slo_miss_action`: what happens to the team's requests whose latency "
                    "targets no instance can meet (`route`, `queue` or `refuse`); requests "
                    "already accepted keep theirs."),
    "admin.rotate_webhook_secret": Operation(
        "Rotate a team's webhook signing secret", ADMIN, c.TeamWebhookSecretObject,
        errors=(403, 404),
        description="A new secret, returned once; the previous one also signs the team's "
                    "events for `webhook_secret_grace_s`."),
    # --- probes, metrics and this document
    "health.healthz": Operation("Liveness", "Probes", c.Healthz, open=True),
    "health.health": Operation(
        "Liveness, as vLLM's server answers it", "Probes", "text/plain", open=True,
        description="200 with an empty body while the process is up, for clients written "
                    "against vLLM's server (benchmark clients check it before they start)."),
    "health.readyz": Operation("Readiness (database and broker)", "Probes", c.Readyz,
                               open=True, other={503: c.Readyz}),
    "metrics.scrape": Operation(
        "Prometheus metrics", "Probes", "text/plain; version=0.0.4; charset=utf-8", open=True,
        errors=(401,), description="No API key; with BLOCKQ_METRICS_TOKEN set, "
        "`Authorization: Bearer <metrics token>`."),
    "openapi.document": Operation("This OpenAPI document", "Documentation",
                                  "application/json", open=True),
    "openapi.docs": Operation("This document as a page", "Documentation", "text/html",
                              open=True),
}


def openapi_path(rule: str) -> str:
    """`/v1/models/<path:model_id>` -> `/v1/models/{model_id}`."""
    return re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule)


def _operation_id(endpoint: str) -> str:
    return endpoint.replace(".", "_")


def _models() -> list[type[BaseModel]]:
    models: list[type[BaseModel]] = [c.ErrorResponse]
    for op in OPERATIONS.values():
        models += [m for m in (op.body, op.response, op.stream, *op.other.values())
                   if isinstance(m, type) and m not in models]
    return models


def _schemas() -> dict[str, Any]:
    _, top = models_json_schema([(m, "validation") for m in _models()],
                                ref_template=SCHEMA_REF)
    return top.get("$defs", {})


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": SCHEMA_REF.format(model=model.__name__)}


def _event_schema(chunk: type[BaseModel]) -> dict[str, Any]:
    """One server-sent event: `data:` is a chunk's JSON, the error object's (a failure mid-way),
    or `[DONE]` at the end."""
    return {
        "type": "object", "required": ["data"],
        "description": "`data: <chunk JSON>` events, then `data: [DONE]`; a failure mid-way "
                       "is one `data: <ErrorResponse JSON>`.",
        "properties": {"event": {"type": "string"}, "data": {"anyOf": [
            {"const": "[DONE]"},
            {"type": "string", "contentMediaType": "application/json",
             "contentSchema": {"anyOf": [_ref(chunk), _ref(c.ErrorResponse)]}},
        ]}},
    }


def _success(op: Operation) -> dict[str, Any]:
    if isinstance(op.response, str):
        schema: dict[str, Any] = ({"type": "object"} if op.response == "application/json"
                                  else {"type": "string"})
        content = {op.response: {"schema": schema}}
    else:
        content = {"application/json": {"schema": _ref(op.response)}}
    if op.stream is not None:
        content["text/event-stream"] = {"schema": _event_schema(op.stream),
                                        "x-event-data": _ref(op.stream)}
    success: dict[str, Any] = {"description": op.summary, "content": content}
    if op.links:
        success["links"] = op.links
    return success


def _operation(endpoint: str, op: Operation, path_params: Iterable[str]) -> dict[str, Any]:
    params = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
              for name in path_params]
    params += [{"name": p.name, "in": p.where, "required": False, "schema": p.schema,
                "description": p.description} for p in op.params]
    errors = sorted(set(op.errors) | (set() if op.open else set(AUTH_ERRORS)))
    if op.body is not None and not op.multipart:
        errors = sorted(set(errors) | {400, 413, 415})
    if any(p["in"] == "path" for p in params):
        errors = sorted(set(errors) | {404})
    responses: dict[str, Any] = {str(op.status): _success(op)}
    responses.update({str(code): {"$ref": ERROR_REF, "description": _DESCRIPTIONS[code]}
                      for code in errors})
    responses.update({str(code): {"description": _DESCRIPTIONS.get(code, model.__name__),
                                  "content": {"application/json": {"schema": _ref(model)}}}
                      for code, model in op.other.items()})
    spec: dict[str, Any] = {"operationId": _operation_id(endpoint), "summary": op.summary,
                            "tags": [op.tag], "responses": responses}
    if op.description:
        spec["description"] = op.description
    if params:
        spec["parameters"] = params
    if op.body is not None:
        media = "multipart/form-data" if op.multipart else "application/json"
        spec["requestBody"] = {"required": True, "content": {media: {"schema": _ref(op.body)}}}
    if op.open:
        spec["security"] = []
    return spec


def build_document(app: Flask) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `app`'s routes that OPERATIONS describes."""
    paths: dict[str, dict[str, Any]] = {}
    for rule in app.url_map.iter_rules():
        op = OPERATIONS.get(rule.endpoint)
        if op is None:
            continue
        item = paths.setdefault(openapi_path(rule.rule), {})
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            item[method.lower()] = _operation(rule.endpoint, op, rule.arguments)
    return {
        "openapi": "3.1.0",
        "info": {"title": "blockq", "version": "1",
                 "description": "LLM inference with predictive routing: a native requests API, "
                                "OpenAI-compatible completions, files and batches."},
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "security": [{"bearerAuth": []}],
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {"bearerAuth": {
                "type": "http", "scheme": "bearer",
                "description": "A team's API key: `Authorization: Bearer bq-...`."}},
            "responses": {"Error": {
                "description": "An OpenAI-style error object.",
                "content": {"application/json": {"schema": _ref(c.ErrorResponse)}}}},
        },
    }


def _document() -> dict[str, Any]:
    """Built once per app (the routes and models do not change while it runs)."""
    cached = current_app.extensions.get("blockq.openapi")
    if cached is None:
        cached = current_app.extensions["blockq.openapi"] = build_document(current_app)
    return cached


@bp.get("/openapi.json")
def document() -> ResponseReturnValue:
    return jsonify(_document())


@bp.get("/docs")
def docs() -> ResponseReturnValue:
    return render_template_string(_PAGE, doc=_document(), ref_name=_ref_name,
                                  schema_rows=_schema_rows)


def _ref_name(schema: dict[str, Any] | None) -> str:
    """A short type name for a schema: the model it refers to, or its type."""
    if not schema:
        return ""
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " | ".join(_ref_name(s) for s in schema[key])
    if schema.get("type") == "array":
        return f"array of {_ref_name(schema.get('items'))}"
    if "const" in schema:
        return repr(schema["const"])
    if "enum" in schema:
        return " | ".join(repr(v) for v in schema["enum"])
    return str(schema.get("type", "any"))


def _schema_rows(schema: dict[str, Any]) -> list[tuple[str, str, bool, str]]:
    required = set(schema.get("required", ()))
    return [(name, _ref_name(prop), name in required, prop.get("description", ""))
            for name, prop in schema.get("properties", {}).items()]


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{ doc.info.title }} API</title>
<style>
body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}
table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ccc;padding:.2rem .5rem;
text-align:left;vertical-align:top}code{background:#f4f4f4}h3{margin-bottom:.2rem}
.m{font-weight:bold;text-transform:uppercase}
</style></head><body>
<h1>{{ doc.info.title }} API</h1><p>{{ doc.info.description }}</p>
<p>Authentication: <code>Authorization: Bearer &lt;team API key&gt;</code> on every call unless
marked open. Errors: <a href="#ErrorResponse">ErrorResponse</a>. Machine-readable:
<a href="openapi.json">openapi.json</a> (OpenAPI {{ doc.openapi }}).</p>
<h2>Operations</h2>
{% for path, item in doc.paths.items() %}{% for method, op in item.items() %}
<h3 id="{{ op.operationId }}"><span class="m">{{ method }}</span> <code>{{ path }}</code>
 &mdash; {{ op.summary }}{% if op.security == [] %} (open){% endif %}</h3>
{% if op.description %}<p>{{ op.description }}</p>{% endif %}
{% if op.parameters %}<table><tr><th>Parameter</th><th>In</th><th>Type</th><th>About</th></tr>
{% for p in op.parameters %}<tr><td><code>{{ p.name }}</code></td><td>{{ p["in"] }}</td>
<td>{{ ref_name(p.schema) }}</td><td>{{ p.description }}</td></tr>{% endfor %}</table>{% endif %}
{% if op.requestBody %}<p>Body: {% for media, m in op.requestBody.content.items() %}
<code>{{ media }}</code> <a href="#{{ ref_name(m.schema) }}">{{ ref_name(m.schema) }}</a>
{% endfor %}</p>{% endif %}
<table><tr><th>Status</th><th>Answer</th></tr>{% for code, r in op.responses.items() %}
<tr><td>{{ code }}</td><td>{{ r.description }}{% for media, m in (r.content or {}).items() %}
<br><code>{{ media }}</code> {{ ref_name(m["x-event-data"] or m.schema) }}{% endfor %}</td></tr>
{% endfor %}</table>
{% endfor %}{% endfor %}
<h2>Schemas</h2>
{% for name, schema in doc.components.schemas.items() %}
<h3 id="{{ name }}">{{ name }}</h3>{% if schema.description %}<p>{{ schema.description }}</p>
{% endif %}{% if schema.properties %}<table><tr><th>Field</th><th>Type</th><th>Required</th>
<th>About</th></tr>{% for f, t, req, about in schema_rows(schema) %}<tr><td><code>{{ f }}</code>
</td><td>{{ t }}</td><td>{{ "yes" if req else "" }}</td><td>{{ about }}</td></tr>{% endfor %}
</table>{% else %}<p>{{ ref_name(schema) }}</p>{% endif %}
{% endfor %}
</body></html>
"""
