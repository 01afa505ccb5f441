"""A request with latency targets that ends without finishing (failed, cancelled, refused at
routing) missed them: the transition that ends it writes slo_*_met False in its own guarded
UPDATE, and blockq_slo_requests_total counts it once, after the commit (missed, or rejected
for a refusal). Redelivered messages and rolled-back transactions count nothing more.
Real PostgreSQL and Redis."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import update

from domain import commands, request_store
from domain.models import InferenceRequest, RequestStatus
from tests.workers.serve.test_request_records import records_of, result_of
from workers.runtime import Runtime

KINDS = ("ttft", "e2e", "all")
OUTCOMES = ("met", "missed", "rejected")


def _counts() -> dict[tuple[str, str], float]:
    return {(kind, outcome): REGISTRY.get_sample_value(
        "blockq_slo_requests_total", {"kind": kind, "outcome": outcome}) or 0.0
        for kind in KINDS for outcome in OUTCOMES}


def _counted_since(before: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """What was counted since `before`, leaving out what did not change."""
    return {key: value - before[key] for key, value in _counts().items()
            if value != before[key]}


def _with_targets(rt: Runtime, request_id: str, **targets: float | None) -> str:
    with rt.db.session() as session:
        session.execute(update(InferenceRequest).where(InferenceRequest.id == request_id)
                        .values(slo_miss_action="route", **targets))
    return request_id


def _outcome(rt: Runtime, request_id: str) -> tuple[str, bool | None, bool | None, object]:
    with rt.db.session() as session:
        row = request_store.get_request(session, request_id)
        return (row.status, row.slo_ttft_met, row.slo_e2e_met,
                request_store.request_to_dict(row)["slo"]["met"])


def test_a_failed_request_missed_its_targets_once(
        rt: Runtime, routed_request: Callable[..., str]) -> None:
    request_id = _with_targets(rt, routed_request("gpu.0", 1, RequestStatus.RUNNING),
                               slo_ttft_ms=500.0, slo_e2e_ms=5000.0)
    before = _counts()

    records_of(rt, "gpu.0").fail(request_id, 1, RuntimeError("engine died"))
    # A redelivered failure (or a late one from another attempt) changes nothing more.
    records_of(rt, "gpu.0").fail(request_id, 1, RuntimeError("engine died"))

    assert _outcome(rt, request_id) == (RequestStatus.FAILED, False, False, False)
    assert _counted_since(before) == {("ttft", "missed"): 1, ("e2e", "missed"): 1,
                                      ("all", "missed"): 1}


@pytest.mark.parametrize("status", [RequestStatus.QUEUED, RequestStatus.ROUTED,
                                    RequestStatus.RUNNING])
def test_a_cancelled_request_missed_its_only_target(
        rt: Runtime, routed_request: Callable[..., str], status: RequestStatus) -> None:
    request_id = _with_targets(rt, routed_request("gpu.0", 1, status), slo_e2e_ms=5000.0)
    before = _counts()

    commands.cancel_request(rt, request_id, team_id=None)  # type: ignore[arg-type]
    commands.cancel_request(rt, request_id, team_id=None)  # type: ignore[arg-type]

    assert _outcome(rt, request_id) == (RequestStatus.CANCELLED, None, False, False)
    assert _counted_since(before) == {("e2e", "missed"): 1, ("all", "missed"): 1}


def test_a_request_ending_after_it_finished_is_not_counted_again(
        rt: Runtime, routed_request: Callable[..., str]) -> None:
    """A late failure of a request that succeeded (a redelivered message) keeps its outcome."""
    request_id = _with_targets(rt, routed_request("gpu.0", 1, RequestStatus.RUNNING),
                               slo_ttft_ms=3_600_000.0)
    records_of(rt, "gpu.0").complete(result_of(request_id), 1)
    before = _counts()

    records_of(rt, "gpu.0").fail(request_id, 1, RuntimeError("late"))

    assert _outcome(rt, request_id) == (RequestStatus.SUCCEEDED, True, None, True)
    assert _counted_since(before) == {}


def test_a_rolled_back_ending_counts_nothing(
        rt: Runtime, routed_request: Callable[..., str]) -> None:
    request_id = _with_targets(rt, routed_request("gpu.0", 1), slo_ttft_ms=500.0)
    before = _counts()
    with pytest.raises(RuntimeError), rt.db.session() as session:
        assert request_store.transition(session, request_id, RequestStatus.FAILED,
                                allowed_from=request_store.ACTIVE_STATUSES)
        raise RuntimeError("the transaction fails after the transition")
    # The next transaction on a session of the same pool starts with nothing to count.
    with rt.db.session() as session:
        assert request_store.get_request(session, request_id).status == RequestStatus.ROUTED

    assert _outcome(rt, request_id) == (RequestStatus.ROUTED, None, None, None)
    assert _counted_since(before) == {}


def test_a_request_without_targets_counts_nothing_when_it_fails(
        rt: Runtime, routed_request: Callable[..., str]) -> None:
    request_id = routed_request("gpu.0", 1, RequestStatus.RUNNING)
    before = _counts()

    records_of(rt, "gpu.0").fail(request_id, 1, RuntimeError("engine died"))

    with rt.db.session() as session:
        row = request_store.get_request(session, request_id)
        assert (row.status, row.slo_ttft_met, row.slo_e2e_met) == (RequestStatus.FAILED,
                                                                   None, None)
    assert _counted_since(before) == {}
