"""Session affinity through the real route task under block (real PostgreSQL and Redis): a
session's next turn goes to the instance of its previous turn while that instance's what-if
is within the margin, not when it is saturated; the decision records what became of the
preference, the session's instance is remembered in Redis with its TTL, and the metric counts
the outcome."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import update

from domain.models import InferenceRequest
from domain.sessions import session_key
from tests.engine_states import engine_state, waiting_request
from tests.workers.request_rows import new_request
from workers.predict import tasks as predict_tasks
from workers.route import stage
from workers.route import tasks as route_tasks
from workers.runtime import Runtime

SESSION = session_key("team_1", "conversation-42")
BUSY = engine_state(*(waiting_request(f"r{i}", 1500, 400) for i in range(40)), num_waiting=40)


@pytest.fixture
def worker(configure_worker: Callable[..., Runtime]) -> Callable[..., Runtime]:
    """The route worker's runtime (block), with two idle instances published."""

    def make(**overrides: Any) -> Runtime:
        # NOTE: a long heartbeat: the instances published once stay alive on a loaded machine.
        rt = configure_worker(**{"routing_policy": "block", "heartbeat_ttl_s": 120.0,
                                 **overrides})
        rt.fleet.publish("gpu.0", engine_state())
        rt.fleet.publish("gpu.1", engine_state())
        return rt

    return make


def _predicted(rt: Runtime, session: str | None = SESSION) -> str:
    """A request as the predict stage leaves it for the route task."""
    with rt.db.session() as session_:
        request_id = new_request(session_, session_key=session)
        session_.execute(update(InferenceRequest).where(InferenceRequest.id == request_id)
                         .values(predicted_output_tokens=200))
        return request_id


def _routed(rt: Runtime, request_id: str) -> tuple[str | None, dict[str, Any] | None]:
    instance_id, routing = _routing(rt, request_id)
    return instance_id, routing.get("affinity")


def _routing(rt: Runtime, request_id: str) -> tuple[str | None, dict[str, Any]]:
    route_tasks.route(request_id)
    with rt.db.session() as session:
        row = session.get(InferenceRequest, request_id)
        assert row is not None
        return row.instance_id, row.routing or {}


def _count(outcome: str) -> float:
    return REGISTRY.get_sample_value("blockq_session_affinity_total",
                                     {"outcome": outcome}) or 0.0


def test_a_session_stays_on_its_instance_while_it_has_room(
        worker: Callable[..., Runtime]) -> None:
    rt = worker()
    before = {o: _count(o) for o in ("none", "applied", "declined")}

    first, affinity = _routed(rt, _predicted(rt))
    assert affinity == {"preferred": None, "outcome": "none"}
    assert stage.last_instance(rt.redis, SESSION) == first
    ttl_ms = rt.redis.pttl(f"blockq:session:{SESSION}:instance")
    assert 0 < ttl_ms <= rt.settings.session_affinity_ttl_s * 1000

    # The next turn goes back to the session's instance, within the margin, although the
    # first turn runs there and block alone would take the other, idle one.
    other = next(i for i in ("gpu.0", "gpu.1") if i != first)
    second, routing = _routing(rt, _predicted(rt))
    assert (second, routing["affinity"]) == (first, {"preferred": first, "outcome": "applied"})
    assert routing["scores"][first] > routing["scores"][other]
    # A request without a session is routed as block alone routes it.
    plain, no_affinity = _routed(rt, _predicted(rt, session=None))
    assert (plain, no_affinity) == (other, None)

    # Its instance saturated: the turn goes elsewhere, which the session then remembers.
    rt.fleet.publish(first, BUSY)
    third, affinity = _routed(rt, _predicted(rt))
    assert (third, affinity) == (other, {"preferred": first, "outcome": "declined"})
    assert stage.last_instance(rt.redis, SESSION) == other

    counted = {o: _count(o) - before[o] for o in before}
    assert counted == {"none": 1, "applied": 1, "declined": 1}


def test_affinity_off_reads_and_records_nothing(worker: Callable[..., Runtime]) -> None:
    rt = worker(session_affinity_ttl_s=0.0)
    _, affinity = _routed(rt, _predicted(rt))
    assert affinity is None
    assert stage.last_instance(rt.redis, SESSION) is None


def test_a_session_whose_instance_is_gone_is_routed_normally(
        worker: Callable[..., Runtime]) -> None:
    rt = worker()
    stage.remember_instance(rt.redis, SESSION, "gpu.7", ttl_s=60)
    instance_id, affinity = _routed(rt, _predicted(rt))
    assert instance_id in {"gpu.0", "gpu.1"}
    assert affinity == {"preferred": "gpu.7", "outcome": "unavailable"}
    assert stage.last_instance(rt.redis, SESSION) == instance_id


def test_the_predict_task_routing_what_it_predicted_reads_the_session_too(
        worker: Callable[..., Runtime]) -> None:
    rt = worker(length_predictor="baseline", route_in_predict=True)
    stage.remember_instance(rt.redis, SESSION, "gpu.1", ttl_s=60)
    with rt.db.session() as session:
        request_id = new_request(session, session_key=SESSION)

    predict_tasks.annotate(request_id)

    with rt.db.session() as session:
        row = session.get(InferenceRequest, request_id)
        assert row is not None and row.routing is not None
        assert row.instance_id == "gpu.1"
        assert row.routing["affinity"]["preferred"] == "gpu.1"
        assert row.routing["affinity"]["outcome"] in {"applied", "kept"}
