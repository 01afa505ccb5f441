"""Fuzzing the API in-process (WSGI) against its own OpenAPI document with schemathesis: per
operation, positive and negative cases generated from the document, every answer checked (no
5xx, status documented, content type and body as documented, streamed events as documented);
then the stateful links (file -> batch -> output file, request -> cancel).

Used by tests/app/test_fuzz_api.py (a run sized for the suite) and scripts/fuzz_api.py (the
full run, with a table of operations x cases x failures).
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import schemathesis
from flask import Flask
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy import select

from app.api import contract
from app.api.services import services
from domain import request_store
from domain.models import InferenceRequest, RequestStatus, utcnow
from domain.streams import StreamWriter

__all__ = ["FuzzResult", "fuzz_operations", "fuzz_links", "engine_stand_in", "CHECKS"]

# NOTE: negative_data_rejection is left out: unknown query parameters are ignored on purpose
# (as OpenAI does), and with the key forced onto every case it misreads a removed header.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]

#: Operations whose successful answer needs the request to finish (see `engine_stand_in`).
WAITING_OPERATIONS = frozenset({"POST /v1/completions", "POST /v1/chat/completions"})
#: Operations the links run through (file -> batch -> output file, request -> cancel).
LINKED_PATHS = ("/v1/files", "/v1/batches", "/v1/requests")

_SETTINGS = dict(deadline=None, database=None, derandomize=True, print_blob=False,
                 suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])


@dataclass(frozen=True)
class Known:
    """Objects of the fuzzing team that most positive cases aim at (a random id only finds
    nothing): the served model, a request, an input file, a batch, fresh files to delete and
    fresh requests to cancel."""

    model: str
    request_id: str
    file_id: str
    batch_id: str
    new_file: Callable[[], str]
    new_request: Callable[[], str]
    instance_id: str | None = None  # a published engine instance (drained, never paused:
    # pause and resume ask the Celery workers, and none runs in-process: 503)
    team_id: str | None = None


def _aim(case: Any, known: Known | None, pick: int) -> None:
    """Point a positive case (3 in 4) at the team's objects: a real id in the path, the served
    model, a batch of the input file, one of prompt and messages."""
    if pick % 4 == 3 or case.meta is None or not case.meta.generation.mode.is_positive:
        return
    if known is not None:
        _aim_path(case, known)
    body = case.body
    if not isinstance(body, dict):
        return
    if case.path in ("/v1/completions", "/v1/chat/completions") and known is not None:
        body["model"] = known.model
    if case.path == "/v1/requests":
        if "prompt" not in body and "messages" not in body:
            body["prompt"] = "hi"
        if "prompt" in body and "messages" in body:
            body.pop(("prompt", "messages")[pick % 2])
    if case.path == "/v1/batches" and known is not None:
        body.update(input_file_id=known.file_id, completion_window="24h",
                    endpoint=("/v1/chat/completions", "/v1/completions")[pick % 2])


def _aim_path(case: Any, known: Known) -> None:
    params = case.path_parameters or {}
    for name, value in (("request_id", known.request_id), ("batch_id", known.batch_id),
                        ("model_id", known.model)):
        if name in params:
            params[name] = value
    if "file_id" in params:
        params["file_id"] = known.new_file() if case.method == "DELETE" else known.file_id
    if "request_id" in params and case.path.endswith("/cancel"):
        params["request_id"] = known.new_request()  # queued: the cancel itself is exercised
    if "instance_id" in params and case.path.endswith("/drain") and known.instance_id:
        params["instance_id"] = known.instance_id
    if "team_id" in params and known.team_id:
        params["team_id"] = known.team_id


@dataclass
class FuzzResult:
    """Cases sent and failures found, per operation label (`METHOD /path`)."""

    cases: Counter[str] = field(default_factory=Counter)
    statuses: dict[str, Counter[int]] = field(default_factory=dict)
    failures: dict[str, list[str]] = field(default_factory=dict)

    def record(self, label: str, status: int | None, failure: str | None) -> None:
        self.cases[label] += 1
        if status is not None:
            self.statuses.setdefault(label, Counter())[status] += 1
        if failure is not None:
            self.failures.setdefault(label, []).append(failure)

    @property
    def total(self) -> int:
        return sum(self.cases.values())

    def table(self) -> str:
        rows = [f"{'operation':<40} {'cases':>6} {'failures':>8}  statuses"]
        for label in sorted(self.cases):
            statuses = ", ".join(f"{code}: {n}" for code, n in
                                 sorted(self.statuses.get(label, Counter()).items()))
            rows.append(f"{label:<40} {self.cases[label]:>6} "
                        f"{len(self.failures.get(label, ())):>8}  {statuses}")
        rows.append(f"{'total':<40} {self.total:>6} "
                    f"{sum(len(f) for f in self.failures.values()):>8}")
        return "\n".join(rows)


def load_schema(app: Flask) -> Any:
    return schemathesis.openapi.from_wsgi("/openapi.json", app)


def _stream_failure(case: Any, response: Any) -> str | None:
    """Each `data:` event of a streamed completion must be a documented chunk (or the error
    object), and the stream must end with `[DONE]` or an error."""
    if not response.headers.get("Content-Type", "").startswith("text/event-stream"):
        return None
    model: type[BaseModel] = (contract.ChatCompletionChunk if "chat" in case.path
                              else contract.CompletionChunk)
    events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    for event in events:
        if event == "[DONE]":
            continue
        payload = json.loads(event)
        try:
            (contract.ErrorResponse if "error" in payload else model).model_validate(payload)
        except ValidationError as exc:
            return f"stream event does not conform: {exc}"
    if not events or (events[-1] != "[DONE]" and '"error"' not in events[-1]):
        return f"stream not ended: {events[-1:]}"
    return None


def _call_and_check(case: Any, headers: dict[str, str], result: FuzzResult,
                    prefix: str = "") -> Any:
    """Send the case and check its answer; the response (None if the call itself failed)."""
    label = f"{prefix}{case.method.upper()} {case.path}"
    status, failure, response = None, None, None
    try:
        response = case.call(headers=headers)
        status = response.status_code
        case.validate_response(response, checks=CHECKS)
        failure = _stream_failure(case, response)
    except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - recorded, the run goes on
        failure = f"{type(exc).__name__}: {getattr(exc, 'message', exc)}"[:4000]
    result.record(label, status, failure)
    return response


def fuzz_operations(app: Flask, headers: dict[str, str], known: Known, *, examples: int,
                    result: FuzzResult | None = None,
                    around: Callable[[str], Any] | None = None) -> FuzzResult:
    """`examples` positive and `examples` negative cases for every operation in the document.

    `around(label)` is a context manager entered while the operation is fuzzed."""
    result = result or FuzzResult()
    schema = load_schema(app)
    document = app.test_client().get("/openapi.json").json
    for found in schema.get_all_operations():
        operation = found.ok()
        label = f"{operation.method.upper()} {operation.path}"
        strategy = st.one_of(operation.as_strategy(GenerationMode.POSITIVE),
                             operation.as_strategy(GenerationMode.NEGATIVE))
        spec = document["paths"][operation.path][operation.method.lower()]
        # NOTE: an operation with no input has nothing to vary: a few calls are enough.
        count = 2 * examples if {"parameters", "requestBody"} & set(spec) else 3

        @settings(max_examples=count, **_SETTINGS)  # type: ignore[arg-type]
        @given(case=strategy, pick=st.integers(0, 255))
        def run(case: Any, pick: int) -> None:
            _aim(case, known, pick)
            _call_and_check(case, headers, result)

        with around(label) if around else _nothing():
            run()
    return result


def fuzz_links(app: Flask, headers: dict[str, str], *, steps: int,
               result: FuzzResult | None = None) -> FuzzResult:
    """Schemathesis's state machine over the documented links between files, batches and
    requests: a response's ids feed the linked operations."""
    result = result or FuzzResult()
    schema = load_schema(app).include(path_regex="^(" + "|".join(LINKED_PATHS) + ")")
    machine = schema.as_state_machine()

    class Links(machine):  # type: ignore[misc,valid-type]
        steps_taken = 0

        def step(self, input: Any) -> Any:
            from schemathesis.generation.stateful.state_machine import (  # noqa: PLC0415
                StepOutput,
            )
            # NOTE: bodies only: the path parameters are the ones the link extracted.
            _aim(input.case, None, self.steps_taken)
            self.steps_taken += 1
            response = _call_and_check(input.case, headers, result, prefix="links: ")
            if response is None:
                raise RuntimeError(f"{input.case.method} {input.case.path}: the call failed")
            return StepOutput(response, input.case)

    Links.run(settings=settings(max_examples=steps, stateful_step_count=8,
                                **_SETTINGS))  # type: ignore[arg-type]
    return result


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextmanager
def engine_stand_in(app: Flask, *, interval_s: float = 0.02) -> Iterator[None]:
    """Finish every queued request as an engine worker's end would (the row succeeded, then the
    stream's end entry), so that sync and streamed completions answer without an engine.

    No Celery worker runs in-process; without this a sync completion waits `sync_timeout_s`
    and answers 504. Only the operations in WAITING_OPERATIONS are fuzzed with it running."""
    with app.app_context():
        svc = services()
    writer = StreamWriter(svc.fleet.redis, flush_interval_s=0.02)
    stop = threading.Event()

    def finish() -> None:
        while not stop.wait(interval_s):
            with svc.db.session() as session:
                ids = session.scalars(select(InferenceRequest.id).where(
                    InferenceRequest.status == RequestStatus.QUEUED)).all()
                done = [rid for rid in ids if request_store.transition(
                    session, rid, RequestStatus.SUCCEEDED, allowed_from=[RequestStatus.QUEUED],
                    output_text="ok", output_tokens=1, finish_reason="stop",
                    finished_at=utcnow())]
            for rid in done:
                writer.follow(rid, 0)
                writer.end(rid, 0, "stop")

    thread = threading.Thread(target=finish, name="engine-stand-in", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
