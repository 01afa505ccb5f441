"""What-ifs on an engine with batch work in flight: the new interactive request runs before the
waiting batch requests and is never the one preempted, as the engines schedule it (class-first
priorities, vLLM's priority policy: tests/workers/serve/test_emulated_engine.py)."""

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
    SeqStatus,
    SimRequest,
    bundled_model,
    engine_priority,
    predict_what_if,
    predict_what_if_stepwise,
    request_priority,
)

from .cases import random_case
from .test_whatif import assert_same, random_future

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


# ---------------------------------------------------------------- the interactive seat reserve

def with_classes(rng: random.Random, snapshot: InstanceSnapshot, new: SimRequest, *,
                 batch_prefill_last: bool = False) -> tuple[InstanceSnapshot, SimRequest]:
    """`snapshot` on a class-first engine (about half its requests batch, the new one either)
    keeping a random number of seats for interactive requests."""
    config = snapshot.config
    config = dataclasses.replace(config, scheduling_policy="priority",
                                 priority_ms_per_token=rng.choice([0.0, 2.0]),
                                 num_interactive_seats=rng.randrange(config.max_num_seqs),
                                 batch_prefill_last=batch_prefill_last)

    def priority(r: SimRequest) -> int:
        return engine_priority(int(rng.random() < 0.5), rng.uniform(0.0, 5.0),
                               r.predicted_output_tokens, config.priority_ms_per_token)

    requests = tuple(dataclasses.replace(r, priority=priority(r)) for r in snapshot.requests)
    return (InstanceSnapshot(config, snapshot.num_free_blocks, requests),
            dataclasses.replace(new, priority=priority(new)))


@pytest.mark.parametrize("seed", range(8))
def test_event_driven_equals_step_by_step_with_a_seat_reserve(seed: int,
                                                              toy_model: ExecModel) -> None:
    rng = random.Random(900 + seed)
    differs = 0
    for case in range(40):
        base, base_new = random_case(rng, max_running=12, max_waiting=10)
        snapshot, new = with_classes(rng, base, base_new)
        future = random_future(rng) if case % 2 else FutureLoad()
        fast = predict_what_if(snapshot, new, toy_model, future=future)
        assert_same(fast, predict_what_if_stepwise(snapshot, new, toy_model, future=future))
        open_config = dataclasses.replace(snapshot.config, num_interactive_seats=0)
        differs += fast != predict_what_if(dataclasses.replace(snapshot, config=open_config),
                                           new, toy_model, future=future)
    assert differs > 3  # the reserve changes the timelines it is tested on


@pytest.mark.parametrize("seed", range(8))
def test_event_driven_equals_step_by_step_with_batch_prefills_last(seed: int,
                                                                   toy_model: ExecModel) -> None:
    rng = random.Random(1900 + seed)
    differs = 0
    for case in range(60):
        base, base_new = random_case(rng, max_running=16, max_waiting=12)
        snapshot, new = with_classes(rng, base, base_new, batch_prefill_last=True)
        future = random_future(rng) if case % 2 else FutureLoad()
        fast = predict_what_if(snapshot, new, toy_model, future=future)
        assert_same(fast, predict_what_if_stepwise(snapshot, new, toy_model, future=future))
        in_order = dataclasses.replace(snapshot.config, batch_prefill_last=False)
        differs += fast != predict_what_if(dataclasses.replace(snapshot, config=in_order),
                                           new, toy_model, future=future)
    assert differs > 0, differs  # the order changes the timelines it is tested on


def test_an_interactive_prefill_goes_before_a_running_batch_prefill() -> None:
    # A batch line with a 2,000-token prompt started prefilling; an interactive request of 100
    # tokens arrives. vLLM's order (running first) gives the batch chunk the 512-token budget
    # for three more steps; with batch prefills last the interactive prompt runs in the next.
    config = dataclasses.replace(TIGHT, num_total_blocks=7289, max_model_len=4096,
                                 batch_prefill_last=True)
    for last, first_token_step in ((True, 1), (False, 4)):
        scheduler = Scheduler(dataclasses.replace(config, batch_prefill_last=last))
        scheduler.add_request(SeqState("b", 2000, 50, priority=engine_priority(1, 0.0, 50, 0.0)))
        scheduler.step()
        scheduler.add_request(SeqState("i", 100, 5, priority=engine_priority(0, 1.0, 5, 0.0),
                                       arrival_s=1.0))
        steps = 1
        while "i" not in scheduler.step().sampled_ids:
            steps += 1
        assert steps == first_token_step, last


def _fill_with_batch(config: InstanceConfig, num_batch: int) -> Scheduler:
    """A scheduler whose first steps admit `num_batch` batch lines of 100 + 400 tokens."""
    scheduler = Scheduler(config)
    for i in range(num_batch):
        scheduler.add_request(SeqState(f"b{i}", 100, 400, priority=engine_priority(
            1, float(i), 400, 0.0), arrival_s=float(i)))
    for _ in range(30):
        scheduler.step()
    return scheduler


def test_a_seat_reserve_seats_an_interactive_arrival_beside_a_full_batch() -> None:
    config = dataclasses.replace(TIGHT, num_total_blocks=7289, max_num_seqs=8,
                                 max_model_len=4096, num_interactive_seats=2)
    held = _fill_with_batch(config, 20)
    assert len(held.running) == 6 and len(held.waiting) == 14  # 2 seats kept free
    held.add_request(SeqState("i", 50, 20, priority=engine_priority(0, 100.0, 20, 0.0),
                              arrival_s=100.0))
    assert "i" in held.step().output.num_scheduled_tokens  # seated in its first step
    assert len(held.running) == 7
    # Without the reserve the batch takes all 8 seats and the interactive request waits for
    # a batch line to finish its answer (hundreds of steps).
    full = _fill_with_batch(dataclasses.replace(config, num_interactive_seats=0), 20)
    assert len(full.running) == 8
    full.add_request(SeqState("i", 50, 20, priority=engine_priority(0, 100.0, 20, 0.0),
                              arrival_s=100.0))
    num_steps = 1
    while "i" not in full.step().output.num_scheduled_tokens:
        num_steps += 1
    assert num_steps > 300


def test_the_reserve_holds_batch_work_only() -> None:
    # Interactive requests take every seat, the reserved ones too; a lone batch request on an
    # otherwise empty engine is always admitted (the reserve is below max_num_seqs).
    config = dataclasses.replace(TIGHT, num_total_blocks=7289, max_num_seqs=4,
                                 max_model_len=4096, num_interactive_seats=3)
    scheduler = Scheduler(config)
    for i in range(4):
        scheduler.add_request(SeqState(f"i{i}", 20, 50, priority=i, arrival_s=float(i)))
    scheduler.step()
    assert len(scheduler.running) == 4
    lone = _fill_with_batch(config, 3)
    assert len(lone.running) == 1
    with pytest.raises(ValueError, match="num_interactive_seats"):
        dataclasses.replace(config, num_interactive_seats=4)


def test_a_burst_beyond_the_reserve_takes_the_seat_of_the_latest_batch_line() -> None:
    config = dataclasses.replace(TIGHT, num_total_blocks=7289, max_num_seqs=8,
                                 max_model_len=4096, num_interactive_seats=2)
    scheduler = _fill_with_batch(config, 20)
    latest_running = max((s for s in scheduler.running), key=lambda s: s.arrival_s)
    for k in range(3):  # three at once: one more than the reserve
        scheduler.add_request(SeqState(f"i{k}", 50, 20, priority=engine_priority(
            0, 100.0 + k, 20, 0.0), arrival_s=100.0 + k))
    first = scheduler.step()
    assert {"i0", "i1"} <= set(first.output.num_scheduled_tokens)
    assert first.output.preempted_ids == ()  # the reserve seats two
    second = scheduler.step()
    assert second.output.preempted_ids == (latest_running.request_id,)
    assert "i2" in second.output.num_scheduled_tokens  # seated in the step it yielded
    assert latest_running.status is SeqStatus.PREEMPTED
    assert latest_running.num_computed_tokens == 0  # recomputed when it runs again
    assert [s.request_id for s in scheduler.waiting][0] == latest_running.request_id
    assert len(scheduler.running) == 8


def test_no_seat_is_taken_from_an_interactive_request_nor_without_a_reserve() -> None:
    config = dataclasses.replace(TIGHT, num_total_blocks=7289, max_num_seqs=4,
                                 max_model_len=4096, num_interactive_seats=1)
    scheduler = Scheduler(config)
    for i in range(5):  # all interactive: the fifth waits for a seat, nobody is preempted
        scheduler.add_request(SeqState(f"i{i}", 20, 50, priority=i, arrival_s=float(i)))
    assert all(not scheduler.step().output.preempted_ids for _ in range(20))
    assert len(scheduler.running) == 4 and len(scheduler.waiting) == 1
    # No reserve: batch lines keep every seat, as vLLM's own scheduler does.
    full = _fill_with_batch(dataclasses.replace(config, num_interactive_seats=0), 6)
    full.add_request(SeqState("i", 50, 20, priority=engine_priority(0, 100.0, 20, 0.0),
                              arrival_s=100.0))
    assert all(not full.step().output.preempted_ids for _ in range(20))
    assert [s.request_id for s in full.waiting][0] == "i"


def test_the_what_if_of_an_interactive_request_on_a_full_batch_engine_counts_the_yield(
        toy_model: ExecModel) -> None:
    # 8 batch lines decoding in 8 seats, the reserve of 2 taken by a burst of interactive
    # requests: the what-if seats the new one at once (a batch line yields), event-driven
    # and step by step alike; on an engine without the seat rule it waits for an answer.
    config = dataclasses.replace(TIGHT, num_total_blocks=7289, max_num_seqs=8,
                                 max_model_len=4096, num_interactive_seats=2)
    running = tuple(_batch(f"b{i}", NOW_S - 10 + i, running=True, num_output=50)
                    for i in range(6)) + tuple(
        SimRequest(f"i{k}", 50, num_computed_tokens=60, num_output_tokens=10,
                   predicted_output_tokens=300, is_running=True,
                   priority=engine_priority(0, NOW_S - 1 + k * 0.1, 300, 0.0))
        for k in range(2))
    snapshot = InstanceSnapshot(config, config.num_usable_blocks - 100, running)
    new = _interactive(config)
    fast = predict_what_if(snapshot, new, toy_model)
    assert_same(fast, predict_what_if_stepwise(snapshot, new, toy_model))
    assert fast.queueing_s == 0.0 and fast.num_preemptions == 1
    no_rule = dataclasses.replace(config, num_interactive_seats=0)
    waits = predict_what_if(dataclasses.replace(snapshot, config=no_rule), new, toy_model)
    assert waits.queueing_s > 0.0 and waits.num_preemptions == 0
