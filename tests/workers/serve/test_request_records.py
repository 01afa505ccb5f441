"""A request's outcome on an engine instance is written by the attempt of record only: a stale
attempt (the request was re-routed since) neither fails nor finishes it. Real PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import update

from domain.models import InferenceRequest, RequestStatus
from domain.streams import StreamWriter
from workers.predict.history import LengthHistory
from workers.runtime import Runtime
from workers.serve.engine import GenerationResult
from workers.serve.feedback import LengthFeedback
from workers.serve.request_records import RequestRecords


def records_of(rt: Runtime, instance_id: str) -> RequestRecords:
    model = rt.settings.model_name
    streams = StreamWriter(rt.redis, flush_interval_s=rt.settings.stream_flush_interval_s)
    return RequestRecords(instance_id, model, rt.outbox, streams,
                          LengthFeedback(rt.redis, rt.bias_watch, model))


def result_of(request_id: str) -> GenerationResult:
    now = time.time()
    return GenerationResult(request_id, "four tokens of text", num_prompt_tokens=3,
                            num_output_tokens=4, finish_reason="stop", admitted_at=now - 1,
                            first_token_at=now - 0.5, finished_at=now)


def test_a_stale_attempt_neither_fails_nor_finishes_a_rerouted_request(
    rt: Runtime, routed_request: Callable[..., str], request_status: Callable[[str], str]
) -> None:
    # Running on gpu.1 as its second attempt: re-routed from gpu.0's first.
    request_id = routed_request("gpu.1", 2, RequestStatus.RUNNING)
    stale = records_of(rt, "gpu.0")

    stale.fail(request_id, 1, RuntimeError("the engine loop died"))
    assert request_status(request_id) == RequestStatus.RUNNING
    stale.complete(result_of(request_id), 1)
    assert request_status(request_id) == RequestStatus.RUNNING

    records_of(rt, "gpu.1").complete(result_of(request_id), 2)
    assert request_status(request_id) == RequestStatus.SUCCEEDED


def test_the_attempt_of_record_fails_its_request(
    rt: Runtime, routed_request: Callable[..., str], request_status: Callable[[str], str]
) -> None:
    request_id = routed_request("gpu.0", 1, RequestStatus.RUNNING)
    records_of(rt, "gpu.0").fail(request_id, 1, RuntimeError("out of memory"))
    assert request_status(request_id) == RequestStatus.FAILED


def test_a_request_run_again_after_a_crash_is_no_prediction_error(
    rt: Runtime, routed_request: Callable[..., str]
) -> None:
    """Ten requests predicted at 100 tokens end at 4: ten misses in a row switch routing to the
    bias watch's fallback, unless they ran again after their instance was lost."""
    model = rt.settings.model_name
    rerouted = [routed_request("gpu.1", 2, RequestStatus.RUNNING) for _ in range(10)]
    first = [routed_request("gpu.1", 1, RequestStatus.RUNNING) for _ in range(10)]
    with rt.db.session() as session:
        session.execute(update(InferenceRequest).where(
            InferenceRequest.id.in_(rerouted + first)).values(predicted_output_tokens=100))
    records = records_of(rt, "gpu.1")
    for request_id in rerouted:
        records.complete(result_of(request_id), 2)
    assert rt.bias_watch.fallback() is None
    assert LengthHistory(rt.redis, model=model).stats().count == 10  # lengths still count
    for request_id in first:
        records.complete(result_of(request_id), 1)
    assert rt.bias_watch.fallback() is not None  # the same misses on first runs do count
