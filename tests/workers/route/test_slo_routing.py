"""Requests with latency targets through the real predict task (which routes what it has just
predicted) under the block policy: a target an instance meets is routed there; one no
instance meets is routed to the closest instance, run there as batch work, or refused (status
rejected, the stream's waiters woken, nothing assigned), as the team's action says; the
outcome metric counts refusals. Real PostgreSQL and Redis."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select, update

from domain.models import InferenceRequest, OutboxEntry, RequestEvent, RequestStatus
from domain.queues import queue_keys, request_ids_in_broker
from domain.streams import read_stream
from tests.engine_states import engine_state, waiting_request
from tests.workers.request_rows import new_request, stored_request
from workers.predict import tasks as predict_tasks
from workers.route import tasks as route_tasks
from workers.runtime import Runtime
from workers.webhooks.events import load_event

#: gpu.0 holds a long queue; gpu.1 is idle.
BUSY = engine_state(*(waiting_request(f"r{i}", 1500, 400) for i in range(40)), num_waiting=40)


@pytest.fixture
def worker(configure_worker: Callable[..., Runtime]) -> Callable[..., Runtime]:
    """The predict worker's runtime (baseline lengths, block), with gpu.0 busy, gpu.1 idle."""

    def make(**overrides: Any) -> Runtime:
        rt = configure_worker(**{"length_predictor": "baseline", "routing_policy": "block",
                                 **overrides})
        rt.fleet.publish("gpu.0", BUSY)
        rt.fleet.publish("gpu.1", engine_state())
        return rt

    return make


def _queued(rt: Runtime, *, action: str = "route", **targets: float) -> str:
    with rt.db.session() as session:
        return new_request(session, slo_miss_action=action,
                           **{f"slo_{kind}": value for kind, value in targets.items()})


def _row(rt: Runtime, request_id: str) -> InferenceRequest:
    return stored_request(rt.db, request_id)


def _events(rt: Runtime, request_id: str) -> list[tuple[str, str | None]]:
    with rt.db.session() as session:
        return [(e.status, e.detail) for e in session.scalars(
            select(RequestEvent).where(RequestEvent.request_id == request_id)
            .order_by(RequestEvent.id))]


def _in_queue(rt: Runtime, queue: str) -> set[str]:
    return request_ids_in_broker(rt.redis, [queue], fresh_s=0)


def _rejections() -> float:
    return REGISTRY.get_sample_value("blockq_slo_requests_total",
                                     {"kind": "all", "outcome": "rejected"}) or 0.0


def test_a_target_an_instance_meets_is_routed_there(worker: Callable[..., Runtime]) -> None:
    rt = worker()
    request_id = _queued(rt, action="refuse", ttft_ms=60_000.0, e2e_ms=600_000.0)

    predict_tasks.annotate(request_id)

    row = _row(rt, request_id)
    assert row.status == RequestStatus.ROUTED and row.priority == "interactive"
    assert row.routing is not None and row.routing["slo"] == {"met": True}
    assert _in_queue(rt, row.instance_id or "") == {request_id}


@pytest.mark.parametrize("action", ["route", "queue"])
def test_an_unmeetable_target_is_routed_to_the_closest_instance(
        worker: Callable[..., Runtime], action: str) -> None:
    rt = worker()
    request_id = _queued(rt, action=action, ttft_ms=1.0)

    predict_tasks.annotate(request_id)

    row = _row(rt, request_id)
    assert (row.status, row.instance_id) == (RequestStatus.ROUTED, "gpu.1")
    assert row.routing is not None
    slo = row.routing["slo"]
    assert (slo["met"], slo["action"], slo["closest"]) == (False, action, "gpu.1")
    assert slo["shortfall"] > 1 and slo["retry_after_s"] >= 1
    assert _in_queue(rt, "gpu.1") == {request_id}
    assert row.priority == ("batch" if action == "queue" else "interactive")
    detail = _events(rt, request_id)[-1][1] or ""
    assert ("run as batch" in detail) == (action == "queue")


def test_an_unmeetable_target_of_a_refusing_team_ends_rejected(
        worker: Callable[..., Runtime]) -> None:
    rt = worker()
    request_id = _queued(rt, action="refuse", ttft_ms=1.0)
    before = _rejections()

    predict_tasks.annotate(request_id)

    row = _row(rt, request_id)
    assert row.status == RequestStatus.REJECTED and row.finished_at is not None
    assert row.error is not None and row.error["code"] == "slo_unmeetable"
    assert 1 <= row.error["retry_after_s"] <= 60 and "Retry in" in row.error["message"]
    assert row.predicted_output_tokens is not None  # the prediction is kept with it
    assert [status for status, _ in _events(rt, request_id)] == [
        "queued", "predicting", "rejected"]
    assert _in_queue(rt, "gpu.0") == set() and _in_queue(rt, "gpu.1") == set()
    assert all(s.assigned == () for s in rt.fleet.statuses())  # nothing assigned
    # Its waiters are woken at once: the stream's final entry.
    first = next(read_stream(rt.redis, request_id, block_ms=100))
    assert first is not None and first.kind == "error"
    assert _rejections() == before + 1
    # A redelivered predict message leaves it rejected, once.
    predict_tasks.annotate(request_id)
    assert len(_events(rt, request_id)) == 3


def test_a_refused_request_with_a_webhook_gets_its_event(
        worker: Callable[..., Runtime]) -> None:
    rt = worker()
    request_id = _queued(rt, action="refuse", ttft_ms=1.0)
    with rt.db.session() as session:
        session.execute(update(InferenceRequest).where(InferenceRequest.id == request_id)
                        .values(webhook_url="http://127.0.0.1:9/hook"))

    predict_tasks.annotate(request_id)

    assert _row(rt, request_id).status == RequestStatus.REJECTED
    assert _in_queue(rt, "webhooks") == {request_id}
    assert _webhook_events(rt) == [[request_id, "request.rejected"]]
    with rt.db.session() as session:
        event = load_event(session, request_id, "request.rejected")
        assert event is not None and event.payload["data"]["status"] == "rejected"
        assert event.payload["data"]["slo"]["met"] is False
    assert rt.outbox.flush()
    with rt.db.session() as session:
        assert list(session.scalars(select(OutboxEntry.task))) == []


def _webhook_events(rt: Runtime) -> list[list[str]]:
    """The arguments of each webhook message waiting in the broker (kombu's JSON envelope)."""
    return [json.loads(base64.b64decode(json.loads(raw)["body"]))[0]
            for key in queue_keys("webhooks") for raw in rt.redis.lrange(key, 0, -1)]


def test_a_re_routed_request_is_never_refused(worker: Callable[..., Runtime]) -> None:
    """Accepted and started once already (its instance was lost): routed anyway."""
    rt = worker()
    request_id = _queued(rt, action="refuse", ttft_ms=1.0)
    with rt.db.session() as session:
        session.execute(update(InferenceRequest).where(InferenceRequest.id == request_id)
                        .values(attempt=1, predicted_output_tokens=20))

    route_tasks.route(request_id)

    row = _row(rt, request_id)
    assert (row.status, row.instance_id, row.attempt) == (RequestStatus.ROUTED, "gpu.1", 2)
    assert row.routing is not None and row.routing["slo"]["action"] == "route"
