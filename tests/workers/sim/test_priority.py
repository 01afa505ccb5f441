"""vLLM's priority scheduling policy in the simulator: predicted-shortest-first with aging."""

from __future__ import annotations

import dataclasses
import random

import pytest

from workers.sim import (
    ExecModel,
    FutureLoad,
    InstanceConfig,
    InstanceSnapshot,
    Scheduler,
    SeqState,
    SimRequest,
    bundled_model,
    predict_what_if,
    predict_what_if_stepwise,
    request_priority,
)

from .cases import random_case
from .test_whatif import A30_QWEN, assert_same, random_future, sharegpt_like_case


def with_priorities(rng: random.Random, snapshot: InstanceSnapshot, new: SimRequest,
                    ) -> tuple[InstanceSnapshot, SimRequest]:
    """`snapshot` on a priority-scheduled instance, with random (often tied) priorities."""
    config = dataclasses.replace(snapshot.config, scheduling_policy="priority",
                                 priority_ms_per_token=rng.choice([0.0, 1.0, 5.0]))
    requests = tuple(dataclasses.replace(r, priority=rng.randint(0, 60))
                     for r in snapshot.requests)
    return (InstanceSnapshot(config, snapshot.num_free_blocks, requests),
            dataclasses.replace(new, priority=rng.randint(0, 60)))


@pytest.mark.parametrize("seed", range(10))
def test_event_driven_equals_step_by_step_under_priority(seed: int,
                                                         toy_model: ExecModel) -> None:
    rng = random.Random(500 + seed)
    differs = preemptions = 0
    for case in range(40):
        fcfs_snapshot, fcfs_new = random_case(rng)
        snapshot, new = with_priorities(rng, fcfs_snapshot, fcfs_new)
        future = random_future(rng) if case % 2 else FutureLoad()
        fast = predict_what_if(snapshot, new, toy_model, future=future)
        assert_same(fast, predict_what_if_stepwise(snapshot, new, toy_model, future=future))
        differs += fast != predict_what_if(fcfs_snapshot, fcfs_new, toy_model, future=future)
        preemptions += fast.num_preemptions
    assert differs > 5  # the policy changes the timelines it is tested on
    assert preemptions > 0


def test_event_driven_equals_step_by_step_under_priority_on_larger_batches(
        toy_model: ExecModel) -> None:
    # More running requests: victims ahead of the request that needs blocks, scheduled
    # prefill chunks given back, decodes skipping a step behind one that preempted itself.
    rng = random.Random(77)
    for case in range(300):
        snapshot, new = random_case(rng, max_running=16, max_waiting=12)
        snapshot = dataclasses.replace(snapshot, config=dataclasses.replace(
            snapshot.config, enable_prefix_caching=False))
        snapshot, new = with_priorities(rng, snapshot, new)
        future = random_future(rng) if case % 2 else FutureLoad()
        assert_same(predict_what_if(snapshot, new, toy_model, future=future),
                    predict_what_if_stepwise(snapshot, new, toy_model, future=future))


@pytest.mark.parametrize("num_blocks", [7289, 600])
def test_event_driven_equals_step_by_step_under_priority_on_busy_a30(num_blocks: int) -> None:
    model = bundled_model("qwen2-7b-a30")
    config = dataclasses.replace(A30_QWEN, num_total_blocks=num_blocks,
                                 scheduling_policy="priority")
    rng = random.Random(num_blocks)
    preemptions = 0
    for num_running, rate in ((8, 0.0), (24, 1.0), (48, 0.0), (48, 10.0)):
        snapshot, new = sharegpt_like_case(rng, num_running, config)
        requests = tuple(dataclasses.replace(r, priority=request_priority(
            -rng.uniform(0.0, 20.0), r.predicted_output_tokens)) for r in snapshot.requests)
        snapshot = InstanceSnapshot(config, snapshot.num_free_blocks, requests)
        new = dataclasses.replace(new, priority=request_priority(0.0,
                                                                 new.predicted_output_tokens))
        future = FutureLoad(rate, 250.0, 330.0) if rate else FutureLoad()
        fast = predict_what_if(snapshot, new, model, future=future)
        assert_same(fast, predict_what_if_stepwise(snapshot, new, model, future=future))
        preemptions += fast.num_preemptions
    if num_blocks == 600:
        assert preemptions > 0


def test_waiting_requests_run_by_priority_and_the_largest_is_preempted() -> None:
    # 10 blocks of 4 tokens: three 8-token prompts fit (2 blocks each, 6), then decodes
    # grow until blocks run out; the running request with the largest priority goes.
    config = InstanceConfig(11, 4, 8, 64, 40, scheduling_policy="priority")
    scheduler = Scheduler(config)
    for request_id, priority in (("late-long", 30), ("short", 10), ("mid", 20)):
        scheduler.add_request(SeqState(request_id, 8, 30, priority=priority))
    assert [s.request_id for s in scheduler.waiting] == ["short", "mid", "late-long"]
    first = scheduler.step()
    assert list(first.output.num_scheduled_tokens) == ["short", "mid", "late-long"]
    preempted = []
    while not preempted:
        preempted = list(scheduler.step().output.preempted_ids)
    assert preempted == ["late-long"]
    fcfs = Scheduler(dataclasses.replace(config, scheduling_policy="fcfs"))
    for request_id, priority in (("late-long", 30), ("short", 10), ("mid", 20)):
        fcfs.add_request(SeqState(request_id, 8, 30, priority=priority))
    assert [s.request_id for s in fcfs.waiting] == ["late-long", "short", "mid"]


def test_request_priority_is_a_virtual_deadline_that_ages() -> None:
    # Shorter first among simultaneous arrivals; a long request is overtaken only by
    # requests arriving within ms_per_token x (its length - theirs) ms after it.
    assert request_priority(0.0, 10, 2.0) < request_priority(0.0, 500, 2.0)
    assert request_priority(0.0, 500, 2.0) == 1000
    assert request_priority(0.9, 10, 2.0) < request_priority(0.0, 500, 2.0)
    assert request_priority(1.1, 10, 2.0) > request_priority(0.0, 500, 2.0)
    assert request_priority(3.0, None, 2.0) == 3000
    with pytest.raises(ValueError, match="scheduling_policy"):
        InstanceConfig(100, 16, 8, 64, 256, scheduling_policy="sjf")
