"""The route stage's decision over published engine states, built here (no Redis)."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Sequence

import pytest

from tests.engine_states import engine_state, waiting_request
from workers.route.planner import Plan, plan_route
from workers.route.policies import RequestView, RoutingContext
from workers.sim import FutureLoad, bundled_model, request_priority
from workers.sim.engine_state import EngineState
from workers.sim.instance_status import Assignment, InstanceStatus

MODEL = bundled_model("qwen2-7b-a30")


def _status(instance_id: str, state: EngineState,
            assigned: Sequence[Assignment] = ()) -> InstanceStatus:
    """A routing candidate as the fleet reads it: alive, accepting, just published."""
    return InstanceStatus(instance_id, alive=True, heartbeat_age_s=0.0, state=state,
                          assigned=tuple(assigned))


def _request(i: int) -> RequestView:
    return RequestView(f"req_{i}", num_prompt_tokens=600, predicted_output_tokens=300,
                       max_tokens=1024)


def _plan(policy: str, candidates: Sequence[InstanceStatus], seed: int = 0) -> Plan:
    ctx = RoutingContext(ticket=seed, rng=random.Random(seed))
    return plan_route(policy, _request(seed), candidates, ctx, MODEL)


@pytest.mark.parametrize("policy", ["least_requests", "least_tokens", "block", "block_ttft"])
def test_assignments_are_visible_to_the_next_decision(policy: str) -> None:
    """A burst onto two idle instances alternates instead of piling onto one."""
    assigned: dict[str, list[Assignment]] = {"gpu.0": [], "gpu.1": []}
    chosen = []
    for i in range(4):
        candidates = [_status(k, engine_state(), v) for k, v in assigned.items()]
        plan = _plan(policy, candidates, seed=i)
        instance_id = plan.decision.instance_id
        assigned[instance_id].append(Assignment(f"req_{i}", 600, 300, at=time.time()))
        chosen.append(instance_id)
        if policy.startswith("block"):
            assert set(plan.what_ifs) == {"gpu.0", "gpu.1"}
    assert sorted(chosen) == ["gpu.0", "gpu.0", "gpu.1", "gpu.1"]
    assert chosen[0] != chosen[1] and chosen[2] != chosen[3]


def test_block_prefers_the_instance_with_less_queued_work() -> None:
    busy = engine_state(*(waiting_request(f"r{i}", 1500, 400) for i in range(20)),
                        num_waiting=20)
    plan = _plan("block", [_status("gpu.0", busy), _status("gpu.1", engine_state())])
    assert plan.decision.instance_id == "gpu.1"
    assert plan.what_ifs["gpu.1"][1] < plan.what_ifs["gpu.0"][1]


@pytest.mark.parametrize("num_probes", [2, 4])
def test_power_of_k_simulates_only_the_instances_it_probes(num_probes: int) -> None:
    candidates = [_status(f"gpu.{k}", engine_state()) for k in range(6)]
    probed_sets = set()
    for seed in range(20):
        plan = _plan(f"po{num_probes}_block", candidates, seed=seed)
        assert len(plan.what_ifs) == len(plan.decision.scores) == num_probes
        assert plan.decision.instance_id in plan.what_ifs
        probed_sets.add(frozenset(plan.what_ifs))
    assert len(probed_sets) > 3  # random probes, not always the same instances


def test_a_request_the_engine_has_not_tokenized_yet_is_left_out() -> None:
    fresh = engine_state(waiting_request("fresh", 0, None), num_waiting=1)
    with_fresh = _plan("block", [_status("gpu.0", fresh)])
    idle = _plan("block", [_status("gpu.0", engine_state())])
    assert with_fresh.what_ifs == idle.what_ifs


def test_the_published_blocks_are_the_usable_ones() -> None:
    """Engines publish the blocks requests can use (vLLM's null block aside): an instance with
    exactly one max_model_len sequence of them, all free, is simulated as such."""
    one_sequence = engine_state(num_total_blocks=256, num_free_blocks=256)  # 4096 / 16
    plan = _plan("block", [_status("gpu.0", one_sequence)])
    ((ttft_s, e2e_s),) = plan.what_ifs.values()
    assert 0 < ttft_s < e2e_s


def test_the_expected_future_load_lengthens_the_what_if() -> None:
    """An instance that gets many requests looks busier than its published state alone."""
    state = engine_state(*(waiting_request(f"r{i}", 300, 200) for i in range(4)), num_waiting=4)
    plain = _status("gpu.0", state)
    loaded = dataclasses.replace(_status("gpu.1", state),
                                 future_load=FutureLoad(5.0, 300.0, 200.0))
    plan = _plan("block", [plain, loaded])
    assert plan.decision.instance_id == "gpu.0"
    assert plan.what_ifs["gpu.1"][1] > plan.what_ifs["gpu.0"][1]


def test_an_instance_scheduling_by_priority_puts_a_shorter_request_ahead_in_its_what_if(
) -> None:
    # 20 queued requests predicted 400 tokens, arrived 100 ms ago: their priority (arrival
    # + 2 ms/token) is later than a new 300-token request's, so under predicted-shortest-
    # first it overtakes them (and assignments routed as long ago stay behind it).
    now = 1_700_000_000.0
    old = [dataclasses.replace(waiting_request(f"r{i}", 1500, 400),
                               priority=request_priority(now - 0.1, 400)) for i in range(20)]
    fcfs = engine_state(*old, num_waiting=20, max_num_seqs=4)
    priority = dataclasses.replace(fcfs, scheduling_policy="priority")
    assigned = [Assignment(f"a{i}", 1500, 400, at=now - 0.1) for i in range(5)]
    ctx = RoutingContext(ticket=0, rng=random.Random(0))
    e2e = {}
    for name, state in (("fcfs", fcfs), ("priority", priority)):
        plan = plan_route("block", _request(0), [_status("gpu.0", state, assigned)], ctx,
                          MODEL, now=now)
        e2e[name] = plan.what_ifs["gpu.0"][1]
    assert e2e["priority"] < 0.5 * e2e["fcfs"]
    assert assigned[0].to_sim_request(priority.instance_config()).priority == (
        request_priority(now - 0.1, 400))
    assert assigned[0].to_sim_request().priority == 0


def test_a_request_routed_again_by_a_redelivered_task_does_not_count_its_own_assignment() -> None:
    """Another run of the same task assigned it a moment ago (its UPDATE decides which run
    wins): the what-if must not meet the same id twice, nor weigh the request against itself."""
    own = Assignment("req_0", 600, 300, at=time.time())
    plan = _plan("block", [_status("gpu.0", engine_state(), [own]),
                           _status("gpu.1", engine_state())])
    alone = _plan("block", [_status("gpu.0", engine_state()), _status("gpu.1", engine_state())])
    assert plan.what_ifs == alone.what_ifs


def test_a_batch_request_is_simulated_behind_the_interactive_work_its_engine_puts_first() -> None:
    """An engine with batch work in flight schedules every interactive request before any batch
    one: the what-if of a batch request (and of a batch line routed but not admitted) must
    queue it behind them, not price it as interactive."""
    now = 1_700_000_000.0
    waiting = [dataclasses.replace(waiting_request(f"r{i}", 1500, 400),
                                   priority=request_priority(now - 0.1, 400)) for i in range(20)]
    state = dataclasses.replace(engine_state(*waiting, num_waiting=20, max_num_seqs=4),
                                scheduling_policy="priority")
    ctx = RoutingContext(ticket=0, rng=random.Random(0))
    e2e = {}
    for name, rank in (("interactive", 0), ("batch", 1)):
        request = dataclasses.replace(_request(0), priority_class=rank)
        plan = plan_route("block", request, [_status("gpu.0", state)], ctx, MODEL, now=now)
        e2e[name] = plan.what_ifs["gpu.0"][1]
    assert e2e["batch"] > 2 * e2e["interactive"]

    line = Assignment("line", 1500, 400, at=now, priority_class=1)
    assert line.to_sim_request(state.instance_config()).priority > max(r.priority for r in waiting)
    assert Assignment.from_json(line.to_json()) == line
    legacy = {k: v for k, v in line.to_json().items() if k != "priority_class"}
    assert Assignment.from_json(legacy).priority_class == 0


def test_capacity_weighted_reads_each_instances_declared_capacity() -> None:
    """The same backlog on both: the instance declared four times as fast takes the request;
    with no capacity declared the one with less backlog does."""
    backlog = [waiting_request(f"r{i}", 600, 300) for i in range(6)]
    fast = dataclasses.replace(engine_state(*backlog, num_waiting=6), capacity_rps=8.0)
    slow = dataclasses.replace(engine_state(*backlog[:3], num_waiting=3), capacity_rps=2.0)
    plan = _plan("capacity_weighted", [_status("gpu.0", fast), _status("gpu.1", slow)])
    assert plan.decision.instance_id == "gpu.0"
    undeclared = [_status("gpu.0", dataclasses.replace(fast, capacity_rps=None)),
                  _status("gpu.1", dataclasses.replace(slow, capacity_rps=None))]
    assert _plan("capacity_weighted", undeclared).decision.instance_id == "gpu.1"
