"""What-ifs on an engine with batch work in flight: the new interactive request runs before the
waiting batch requests and is never the one preempted, as the engines schedule it (class-first
priorities, vLLM's priority policy: tests/workers/serve/test_emulated_engine.py)."""

from __future__ import annotations

import dataclasses

import pytest

from workers.sim import (
    InstanceConfig,
    InstanceSnapshot,
    SimRequest,
    bundled_model,
    engine_priority,
    predict_what_if,
    predict_what_if_stepwise,
    request_priority,
)

from .test_whatif import assert_same

NOW_S = 1_000.0
#: 32 usable blocks of 16 tokens: two batch requests of 220 tokens hold 28 of them.
TIGHT = InstanceConfig(num_total_blocks=33, block_size=16, max_num_seqs=48,
                       max_num_batched_tokens=512, max_model_len=512,
                       scheduling_policy="priority", priority_ms_per_token=0.0)


def _batch(request_id: str, arrival_s: float, *, running: bool, num_output: int) -> SimRequest:
    """A batch line as an engine publishes it under "fcfs" (class, then arrival ms)."""
    return SimRequest(request_id, 100, num_computed_tokens=100 + num_output if running else 0,
                      num_output_tokens=num_output, predicted_output_tokens=400,
                      is_running=running, priority=engine_priority(1, arrival_s, 400, 0.0))


def _snapshot(config: InstanceConfig) -> InstanceSnapshot:
    # b0 and b1 run; b2 was preempted when the cache filled and waits, 100 tokens in.
    requests = (_batch("b0", NOW_S - 9, running=True, num_output=120),
                _batch("b1", NOW_S - 8, running=True, num_output=120),
                _batch("b2", NOW_S - 7, running=False, num_output=100))
    return InstanceSnapshot(config, config.num_usable_blocks - 28, requests)


def _interactive(config: InstanceConfig) -> SimRequest:
    """The new request with the priority the router gives it (workers/route/planner.py)."""
    return SimRequest("i", 50, predicted_output_tokens=20,
                      priority=request_priority(NOW_S, 20, config.priority_ms_per_token))


def test_the_what_if_runs_a_new_interactive_request_ahead_of_waiting_batch_work() -> None:
    model = bundled_model("qwen2-7b-a30")
    fast = predict_what_if(_snapshot(TIGHT), _interactive(TIGHT), model)
    assert_same(fast, predict_what_if_stepwise(_snapshot(TIGHT), _interactive(TIGHT), model))
    # Admitted in the first step (the preempted b2 waits), then 19 decodes: never preempted,
    # though the batch requests preempt one another as they grow.
    assert fast.queueing_s == 0.0
    assert fast.num_steps == 20
    assert fast.e2e_s < 20 * 0.05
    # The same snapshot under plain FCFS (what engines published before): the new request
    # queues behind the preempted b2, which waits for b0 to finish its 280 remaining tokens.
    fcfs = dataclasses.replace(TIGHT, scheduling_policy="fcfs")
    behind = predict_what_if(_snapshot(fcfs), _interactive(fcfs), model)
    assert behind.queueing_s > 10 * fast.e2e_s
    assert behind.num_steps > 280


@pytest.mark.parametrize("ms_per_token", [0.0, 2.0])
def test_class_dominates_predicted_shortest_first(ms_per_token: float) -> None:
    # A batch request that arrived long before and is predicted one token still goes after an
    # interactive request predicted at the longest, however long it has waited (a day here).
    batch = engine_priority(1, NOW_S - 86_400, 1, ms_per_token)
    interactive = engine_priority(0, NOW_S, 4096, ms_per_token)
    assert interactive < batch
    assert request_priority(NOW_S, 4096, ms_per_token) < batch  # the router's target priority
