"""The route stage's decision over published states in the real Redis: freshness, bookkeeping."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import pytest
import redis

from app.fleet import Fleet
from tests.conftest import TEST_REDIS_URL
from workers.route.planner import plan_route
from workers.route.policies import RequestView, RoutingContext
from workers.sim import bundled_model

pytestmark = pytest.mark.services


def _idle_state(num_free_blocks: int = 7288) -> dict:  # type: ignore[type-arg]
    return {
        "engine_kind": "emulated",
        "num_running": 0,
        "num_waiting": 0,
        "num_total_blocks": 7288,
        "num_free_blocks": num_free_blocks,
        "block_size": 16,
        "max_num_seqs": 48,
        "max_num_batched_tokens": 512,
        "max_model_len": 4096,
        "requests": [],
    }


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    client = redis.Redis.from_url(TEST_REDIS_URL)
    client.flushdb()
    yield Fleet(client, heartbeat_ttl_s=0.4)
    client.flushdb()
    client.close()


def _request(i: int) -> RequestView:
    return RequestView(f"req_{i}", num_prompt_tokens=600, predicted_output_tokens=300,
                       max_tokens=1024)


def test_an_instance_without_a_fresh_heartbeat_is_no_candidate(fleet: Fleet) -> None:
    fleet.publish("gpu.0", _idle_state())
    fleet.publish("gpu.1", _idle_state())
    time.sleep(0.25)
    fleet.publish("gpu.1", _idle_state())
    time.sleep(0.25)
    assert [s.instance_id for s in fleet.routable()] == ["gpu.1"]
    assert {s.instance_id: s.alive for s in fleet.statuses()} == {"gpu.0": False, "gpu.1": True}


@pytest.mark.parametrize("policy", ["least_requests", "least_tokens", "block", "block_ttft"])
def test_assignments_are_visible_to_the_next_decision(fleet: Fleet, policy: str) -> None:
    """A burst onto two idle instances alternates instead of piling onto one."""
    fleet.publish("gpu.0", _idle_state())
    fleet.publish("gpu.1", _idle_state())
    model = bundled_model("qwen2-7b-a30")
    chosen = []
    for i in range(4):
        ctx = RoutingContext(ticket=i, rng=random.Random(i))
        plan = plan_route(policy, _request(i), fleet.routable(), ctx, model)
        decision = plan.decision
        fleet.assign(decision.instance_id, f"req_{i}", num_prompt_tokens=600,
                     predicted_output_tokens=300)
        chosen.append(decision.instance_id)
        if policy.startswith("block"):
            assert set(plan.what_ifs) == {"gpu.0", "gpu.1"}
    assert sorted(chosen) == ["gpu.0", "gpu.0", "gpu.1", "gpu.1"]
    assert chosen[0] != chosen[1] and chosen[2] != chosen[3]


def test_block_prefers_the_instance_with_less_queued_work(fleet: Fleet) -> None:
    busy = _idle_state()
    busy["requests"] = [
        {"request_id": f"r{i}", "num_prompt_tokens": 1500, "num_computed_tokens": 0,
         "num_output_tokens": 0, "predicted_output_tokens": 400, "is_running": False}
        for i in range(20)
    ]
    fleet.publish("gpu.0", busy)
    fleet.publish("gpu.1", _idle_state())
    ctx = RoutingContext(ticket=0, rng=random.Random(0))
    plan = plan_route("block", _request(0), fleet.routable(), ctx, bundled_model("qwen2-7b-a30"))
    assert plan.decision.instance_id == "gpu.1"
    assert plan.what_ifs["gpu.1"][1] < plan.what_ifs["gpu.0"][1]


@pytest.mark.parametrize("num_probes", [2, 4])
def test_power_of_k_simulates_only_the_instances_it_probes(fleet: Fleet, num_probes: int) -> None:
    for k in range(6):
        fleet.publish(f"gpu.{k}", _idle_state())
    model = bundled_model("qwen2-7b-a30")
    probed_sets = set()
    for seed in range(20):
        ctx = RoutingContext(ticket=seed, rng=random.Random(seed))
        plan = plan_route(f"po{num_probes}_block", _request(0), fleet.routable(), ctx, model)
        assert len(plan.what_ifs) == len(plan.decision.scores) == num_probes
        assert plan.decision.instance_id in plan.what_ifs
        probed_sets.add(frozenset(plan.what_ifs))
    assert len(probed_sets) > 3  # random probes, not always the same instances


def test_a_published_state_that_shows_a_request_clears_its_assignment(fleet: Fleet) -> None:
    fleet.publish("gpu.0", _idle_state())
    fleet.assign("gpu.0", "req_1", num_prompt_tokens=10, predicted_output_tokens=5)
    fleet.assign("gpu.0", "req_2", num_prompt_tokens=10, predicted_output_tokens=5)
    assert fleet.routable()[0].num_assigned == 2
    shown = _idle_state()
    shown["requests"] = [{"request_id": "req_1", "num_prompt_tokens": 10,
                          "num_computed_tokens": 0, "num_output_tokens": 0,
                          "predicted_output_tokens": 5, "is_running": False}]
    fleet.publish("gpu.0", shown)
    assert [a["request_id"] for a in fleet.routable()[0].assigned] == ["req_2"]
    fleet.unassign("gpu.0", "req_2")
    assert fleet.routable()[0].num_assigned == 0


def test_a_request_the_engine_has_not_tokenized_yet_is_left_out(fleet: Fleet) -> None:
    state = _idle_state()
    state["requests"] = [{"request_id": "fresh", "num_prompt_tokens": 0,
                          "num_computed_tokens": 0, "num_output_tokens": 0,
                          "predicted_output_tokens": None, "is_running": False}]
    fleet.publish("gpu.0", state)
    ctx = RoutingContext(ticket=0, rng=random.Random(0))
    plan = plan_route("block", _request(0), fleet.routable(), ctx, bundled_model("qwen2-7b-a30"))
    assert plan.decision.instance_id == "gpu.0"
