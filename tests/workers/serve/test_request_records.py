"""A request's outcome on an engine instance is written by the attempt of record only: a stale
attempt (the request was re-routed since) neither fails nor finishes it. Real PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import update

from app import store
from app.models import InferenceRequest, Priority, RequestStatus
from app.settings import Settings
from app.streams import StreamWriter
from workers.runtime import Runtime
from workers.serve.engine import GenerationResult
from workers.serve.feedback import LengthFeedback
from workers.serve.request_records import RequestRecords


@pytest.fixture
def rt(fresh_services: Settings) -> Iterator[Runtime]:
    runtime = Runtime(fresh_services)
    yield runtime
    runtime.db.engine.dispose()


def routed_request(rt: Runtime, instance_id: str, attempt: int) -> str:
    """A request routed to `instance_id` as its `attempt`-th routing and running there."""
    fields = {"priority": Priority.INTERACTIVE, "prompt": "Hello", "messages": None,
              "max_tokens": 16, "temperature": 1.0, "top_p": 1.0, "seed": None, "stop": None,
              "webhook_url": None, "stream": False, "request_metadata": None,
              "body_sha256": "0" * 64, "prompt_tokens": 3}
    with rt.db.session() as session:
        request, _ = store.create_request(session, fields, idempotency_key=None)
        session.flush()
        session.execute(update(InferenceRequest).where(InferenceRequest.id == request.id)
                        .values(status=RequestStatus.RUNNING, instance_id=instance_id,
                                attempt=attempt))
        return request.id


def records_of(rt: Runtime, instance_id: str) -> RequestRecords:
    model = rt.settings.model_name
    return RequestRecords(instance_id, model, rt.db, StreamWriter(rt.redis),
                          LengthFeedback(rt.redis, rt.bias_watch, model))


def result_of(request_id: str) -> GenerationResult:
    now = time.time()
    return GenerationResult(request_id, "four tokens of text", num_prompt_tokens=3,
                            num_output_tokens=4, finish_reason="stop", admitted_at=now - 1,
                            first_token_at=now - 0.5, finished_at=now)


def status_of(rt: Runtime, request_id: str) -> str:
    with rt.db.session() as session:
        request = session.get(InferenceRequest, request_id)
        assert request is not None
        return request.status


def test_a_stale_attempt_neither_fails_nor_finishes_a_rerouted_request(rt: Runtime) -> None:
    request_id = routed_request(rt, "gpu.1", attempt=2)  # re-routed from gpu.0's attempt 1
    stale = records_of(rt, "gpu.0")

    stale.fail(request_id, 1, RuntimeError("the engine loop died"))
    assert status_of(rt, request_id) == RequestStatus.RUNNING
    stale.complete(result_of(request_id), 1)
    assert status_of(rt, request_id) == RequestStatus.RUNNING

    records_of(rt, "gpu.1").complete(result_of(request_id), 2)
    assert status_of(rt, request_id) == RequestStatus.SUCCEEDED


def test_the_attempt_of_record_fails_its_request(rt: Runtime) -> None:
    request_id = routed_request(rt, "gpu.0", attempt=1)
    records_of(rt, "gpu.0").fail(request_id, 1, RuntimeError("out of memory"))
    assert status_of(rt, request_id) == RequestStatus.FAILED
