"""The fleet's live state in the real Redis: published states, heartbeats, assignments."""

from __future__ import annotations

import json
import random
import time

import pytest
import redis

from domain.live_fleet import Fleet
from tests.engine_states import engine_state, waiting_request
from workers.route.planner import plan_route
from workers.route.policies import RequestView, RoutingContext
from workers.sim import bundled_model
from workers.sim.engine_state import EngineState

pytestmark = pytest.mark.services


@pytest.fixture
def fleet(empty_redis: redis.Redis) -> Fleet:
    return Fleet(empty_redis, heartbeat_ttl_s=0.4)


def test_the_state_is_stored_as_the_engines_json_and_read_back_typed(fleet: Fleet) -> None:
    state = engine_state(waiting_request("r1", 10, 5), num_waiting=1, taken_at=12.5)
    published = state.published("gpu.0", "served-model", accepting=True)
    before = time.time()
    fleet.publish("gpu.0", published)
    stored = json.loads(fleet.redis.get("blockq:instance:gpu.0:state"))
    assert list(stored) == [
        "engine_kind", "model", "num_running", "num_waiting", "num_total_blocks",
        "num_free_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
        "max_model_len", "requests", "taken_at", "instance_id", "accepting", "published_at",
        "scheduling_policy", "priority_ms_per_token", "prefix_unit_tokens", "cached_prefixes",
        "num_interactive_seats", "batch_prefill_last", "model_path", "hardware", "exec_model",
        "capacity_rps"]
    assert stored["requests"] == [{
        "request_id": "r1", "num_prompt_tokens": 10, "num_computed_tokens": 0,
        "num_output_tokens": 0, "predicted_output_tokens": 5, "is_running": False,
        "priority": 0}]
    assert (stored["instance_id"], stored["model"]) == ("gpu.0", "served-model")
    (status,) = fleet.statuses()
    assert status.state is not None
    assert status.state.published_at is not None and status.state.published_at >= before
    assert status.state == EngineState.from_json(stored)
    assert (status.num_waiting, status.accepting) == (1, True)


def test_an_instance_without_a_fresh_heartbeat_is_no_candidate(fleet: Fleet) -> None:
    fleet.publish("gpu.0", engine_state())
    fleet.publish("gpu.1", engine_state())
    # NOTE: wait for the expiry itself, not for a fixed time: a loaded machine may sleep longer.
    deadline = time.monotonic() + 5
    while fleet.redis.exists("blockq:instance:gpu.0:alive") and time.monotonic() < deadline:
        time.sleep(0.05)
    fleet.publish("gpu.1", engine_state())  # a fresh heartbeat, 0.4 s to live
    assert [s.instance_id for s in fleet.routable()] == ["gpu.1"]
    assert {s.instance_id: s.alive for s in fleet.statuses()} == {"gpu.0": False, "gpu.1": True}


def test_a_withdrawing_instance_is_no_candidate(fleet: Fleet) -> None:
    fleet.publish("gpu.0", engine_state(accepting=False))
    assert fleet.routable() == [] and fleet.statuses()[0].alive


def test_a_published_state_that_shows_a_request_clears_its_assignment(fleet: Fleet) -> None:
    fleet.publish("gpu.0", engine_state())
    fleet.assign("gpu.0", "req_1", num_prompt_tokens=10, predicted_output_tokens=5)
    fleet.assign("gpu.0", "req_2", num_prompt_tokens=10, predicted_output_tokens=5)
    assert fleet.routable()[0].num_assigned == 2
    fleet.publish("gpu.0", engine_state(waiting_request("req_1", 10, 5), num_waiting=1))
    assert [a.request_id for a in fleet.routable()[0].assigned] == ["req_2"]
    fleet.unassign("gpu.0", "req_2")
    assert fleet.routable()[0].num_assigned == 0


def test_a_registered_instance_without_a_state_reads_as_empty(fleet: Fleet) -> None:
    fleet.redis.sadd("blockq:instances", "gpu.9")
    (status,) = fleet.statuses()
    assert status.state is None and status.heartbeat_age_s is None and not status.alive
    assert (status.num_running, status.num_waiting, status.accepting) == (0, 0, True)


def test_routing_through_redis_spreads_a_burst(fleet: Fleet) -> None:
    """Each decision's assignment, stored in Redis, is seen by the next decision."""
    fleet.publish("gpu.0", engine_state())
    fleet.publish("gpu.1", engine_state())
    chosen = []
    for i in range(2):
        request = RequestView(f"req_{i}", num_prompt_tokens=600, predicted_output_tokens=300,
                              max_tokens=1024)
        ctx = RoutingContext(ticket=i, rng=random.Random(i))
        plan = plan_route("block", request, fleet.routable(), ctx, bundled_model("qwen2-7b-a30"))
        fleet.assign(plan.decision.instance_id, f"req_{i}", num_prompt_tokens=600,
                     predicted_output_tokens=300)
        chosen.append(plan.decision.instance_id)
    assert sorted(chosen) == ["gpu.0", "gpu.1"]


def test_recent_routing_gives_each_instance_its_expected_future_load(
        empty_redis: redis.Redis) -> None:
    fleet = Fleet(empty_redis, heartbeat_ttl_s=5, recent_window_s=2.0)
    fleet.publish("gpu.0", engine_state())
    fleet.publish("gpu.1", engine_state())
    for i, (prompt, output) in enumerate([(100, 10), (300, 30)]):
        fleet.assign("gpu.0", f"req_{i}", num_prompt_tokens=prompt,
                     predicted_output_tokens=output)
    # Admission clears the assignment, not the history the rate comes from.
    fleet.publish("gpu.0", engine_state(waiting_request("req_0", 100, 10), num_waiting=1))
    loads = {s.instance_id: s.future_load for s in fleet.statuses()}
    assert loads["gpu.0"].rate_per_s == pytest.approx(1.0)  # two in the last 2 s
    assert (loads["gpu.0"].num_prompt_tokens, loads["gpu.0"].num_output_tokens) == (200, 20)
    assert not loads["gpu.1"].active
    # Without a window nothing is kept or estimated.
    plain = Fleet(empty_redis, heartbeat_ttl_s=5)
    plain.assign("gpu.1", "req_9", num_prompt_tokens=100, predicted_output_tokens=10)
    assert not any(s.future_load.active for s in plain.statuses())
    assert not empty_redis.exists("blockq:instance:gpu.1:recent")


def test_each_instance_declares_its_model_and_routers_choose_among_that_models_only(
        fleet: Fleet) -> None:
    for instance_id, model in (("gpu.0", "big"), ("gpu.1", "small"), ("gpu.2", "big")):
        fleet.publish(instance_id, engine_state().published(instance_id, model, accepting=True))
    assert [s.instance_id for s in fleet.routable("big")] == ["gpu.0", "gpu.2"]
    assert [s.instance_id for s in fleet.routable("small")] == ["gpu.1"]
    assert fleet.routable("other") == [] and len(fleet.routable()) == 3
    fleet.mark_stopped("gpu.1")
    assert fleet.model_instances() == {"big": {"gpu.0": True, "gpu.2": True},
                                       "small": {"gpu.1": False}}
    assert fleet.live_models() == ["big"]
