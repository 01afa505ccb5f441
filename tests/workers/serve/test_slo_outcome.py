"""A completed request with latency targets records whether it met each (measured from its
acceptance), shows it in its JSON, and counts it in blockq_slo_requests_total (goodput).
Real PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import REGISTRY
from sqlalchemy import update

from domain import request_store
from domain.models import InferenceRequest, RequestStatus
from tests.workers.serve.test_request_records import records_of
from workers.runtime import Runtime
from workers.serve.engine import GenerationResult


def _count(kind: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("blockq_slo_requests_total",
                                     {"kind": kind, "outcome": outcome}) or 0.0


def _running_with_targets(rt: Runtime, routed_request: Callable[..., str],
                          **targets: float | None) -> str:
    request_id = routed_request("gpu.0", 1, RequestStatus.RUNNING)
    with rt.db.session() as session:
        session.execute(update(InferenceRequest).where(InferenceRequest.id == request_id)
                        .values(slo_miss_action="route", **targets))
    return request_id


def _finish(rt: Runtime, request_id: str, *, first_token_after_s: float,
            finished_after_s: float) -> dict:
    with rt.db.session() as session:
        row = session.get(InferenceRequest, request_id)
        assert row is not None
        created = row.created_at.timestamp()
    result = GenerationResult(request_id, "four tokens of text", num_prompt_tokens=3,
                              num_output_tokens=4, finish_reason="stop", admitted_at=created,
                              first_token_at=created + first_token_after_s,
                              finished_at=created + finished_after_s)
    records_of(rt, "gpu.0").complete(result, 1)
    with rt.db.session() as session:
        return request_store.request_to_dict(request_store.get_request(session, request_id))


def test_met_and_missed_targets_are_recorded_and_counted(
        rt: Runtime, routed_request: Callable[..., str]) -> None:
    before = {(k, o): _count(k, o) for k in ("ttft", "e2e", "all") for o in ("met", "missed")}
    request_id = _running_with_targets(rt, routed_request, slo_ttft_ms=500.0,
                                       slo_e2e_ms=2000.0)

    shown = _finish(rt, request_id, first_token_after_s=0.3, finished_after_s=2.5)

    assert shown["status"] == "succeeded"
    assert shown["slo"] == {"ttft_ms": 500.0, "e2e_ms": 2000.0, "miss_action": "route",
                            "ttft_met": True, "e2e_met": False, "met": False}
    after = {key: _count(*key) - value for key, value in before.items()}
    assert after == {("ttft", "met"): 1, ("ttft", "missed"): 0, ("e2e", "met"): 0,
                     ("e2e", "missed"): 1, ("all", "met"): 0, ("all", "missed"): 1}


def test_a_request_meeting_its_only_target_counts_as_goodput(
        rt: Runtime, routed_request: Callable[..., str]) -> None:
    before_met, before_e2e = _count("all", "met"), _count("e2e", "met")
    request_id = _running_with_targets(rt, routed_request, slo_ttft_ms=800.0)

    shown = _finish(rt, request_id, first_token_after_s=0.2, finished_after_s=5.0)

    assert shown["slo"]["ttft_met"] is True and shown["slo"]["e2e_met"] is None
    assert shown["slo"]["met"] is True
    assert _count("all", "met") == before_met + 1
    assert _count("e2e", "met") == before_e2e  # it had no end-to-end target


def test_a_request_without_targets_has_no_outcome(
        rt: Runtime, routed_request: Callable[..., str]) -> None:
    before = _count("all", "met") + _count("all", "missed")
    request_id = routed_request("gpu.0", 1, RequestStatus.RUNNING)
    now = time.time()
    records_of(rt, "gpu.0").complete(GenerationResult(
        request_id, "text", num_prompt_tokens=3, num_output_tokens=1, finish_reason="stop",
        admitted_at=now, first_token_at=now, finished_at=now), 1)
    with rt.db.session() as session:
        row = request_store.get_request(session, request_id)
        assert row.status == RequestStatus.SUCCEEDED
        assert request_store.request_to_dict(row)["slo"] is None
        assert (row.slo_ttft_met, row.slo_e2e_met) == (None, None)
    assert _count("all", "met") + _count("all", "missed") == before
