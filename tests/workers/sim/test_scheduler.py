"""The step-by-step vLLM scheduler model: budgets, limits, blocks, order, preemption."""

from __future__ import annotations

import random

import pytest

from workers.sim import InstanceConfig, Scheduler, SeqState, SeqStatus


def config(**overrides) -> InstanceConfig:
    values = dict(num_total_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=32,
                  max_model_len=128)
    return InstanceConfig(**(values | overrides))


def seq(request_id: str, prompt: int, output: int, cached: int = 0) -> SeqState:
    return SeqState(request_id, prompt, output, num_cached_tokens=cached)


def run_workload(scheduler: Scheduler, arrivals: dict[int, list[SeqState]],
                 max_steps: int = 10_000) -> list:
    """Step until every request is done, checking invariants after each step."""
    cfg = scheduler.config
    results = []
    for step in range(max_steps):
        for s in arrivals.get(step, []):
            scheduler.add_request(s)
        if not scheduler.has_unfinished_requests and step > max(arrivals, default=0):
            return results
        result = scheduler.step()
        results.append(result)
        scheduled = result.output.num_scheduled_tokens
        assert sum(scheduled.values()) <= cfg.max_num_batched_tokens
        assert len(scheduler.running) <= cfg.max_num_seqs
        held = sum(s.num_owned_blocks for s in scheduler.running)
        assert 0 <= scheduler.block_pool.num_free
        assert held + scheduler.block_pool.num_free <= cfg.num_usable_blocks
        for s in scheduler.running:
            assert s.num_computed_tokens <= s.num_tokens
            assert s.num_owned_blocks + s.num_shared_blocks >= -(-s.num_computed_tokens
                                                                 // cfg.block_size)
        for s in scheduler.waiting:
            assert s.num_owned_blocks == 0 and s.num_computed_tokens == 0
    raise AssertionError("workload did not finish")


@pytest.mark.parametrize("seed", range(25))
def test_random_workloads_keep_limits_and_finish_exactly(seed: int) -> None:
    rng = random.Random(seed)
    block_size = rng.choice([1, 4, 16])
    max_num_seqs = rng.randint(1, 6)
    cfg = config(block_size=block_size, num_total_blocks=rng.randint(128, 384) // block_size + 1,
                 max_num_seqs=max_num_seqs,
                 max_num_batched_tokens=rng.randint(max(8, max_num_seqs), 64),
                 enable_prefix_caching=rng.random() < 0.5, watermark=rng.choice([0.0, 0.1]))
    scheduler = Scheduler(cfg)
    arrivals: dict[int, list[SeqState]] = {}
    seqs: list[SeqState] = []
    for i in range(12):
        prompt = rng.randint(1, 80)
        seqs.append(seq(f"q{i}", prompt, rng.randint(1, min(40, cfg.max_model_len - prompt))))
        arrivals.setdefault(rng.randint(0, 30), []).append(seqs[-1])
    results = run_workload(scheduler, arrivals)
    sampled = [rid for r in results for rid in r.sampled_ids]
    finished = [rid for r in results for rid in r.finished_ids]
    assert sorted(finished) == sorted(s.request_id for s in seqs)
    for s in seqs:
        assert sampled.count(s.request_id) == s.max_output_tokens == s.num_output_tokens
        assert s.status is SeqStatus.FINISHED
    assert not scheduler.requests
    assert scheduler.block_pool.num_free == cfg.num_usable_blocks


def test_waiting_requests_are_admitted_first_come_first_served() -> None:
    scheduler = Scheduler(config(max_num_seqs=2, max_num_batched_tokens=8))
    first_scheduled: list[str] = []
    arrivals = {0: [seq(f"q{i}", 5, 3) for i in range(6)]}
    for result in run_workload(scheduler, arrivals):
        for request_id in result.output.num_scheduled_tokens:
            if request_id not in first_scheduled:
                first_scheduled.append(request_id)
    assert first_scheduled == [f"q{i}" for i in range(6)]


def test_running_requests_go_first_and_prefills_are_chunked() -> None:
    scheduler = Scheduler(config(max_num_batched_tokens=16))
    scheduler.add_request(seq("a", 4, 5))
    scheduler.step()  # a: prefill of 4 tokens, first output token
    scheduler.add_request(seq("b", 40, 2))
    chunks = [scheduler.step().output.num_scheduled_tokens for _ in range(3)]
    assert chunks == [{"a": 1, "b": 15}, {"a": 1, "b": 15}, {"a": 1, "b": 10}]
    assert scheduler.requests["b"].num_output_tokens == 1


def test_max_num_seqs_caps_the_running_batch() -> None:
    scheduler = Scheduler(config(max_num_seqs=2))
    for i in range(3):
        scheduler.add_request(seq(f"q{i}", 2, 10))
    output = scheduler.step().output
    assert list(output.num_scheduled_tokens) == ["q0", "q1"]
    assert [s.request_id for s in scheduler.waiting] == ["q2"]


def test_preemption_recomputes_the_last_running_request_when_blocks_run_out() -> None:
    # 8 usable blocks of 4 tokens. Two requests of 12 prompt tokens hold 3 blocks each
    # and grow one block every 4 steps, so the cache runs out and the later one yields.
    cfg = config(num_total_blocks=9, block_size=4, max_model_len=32)
    scheduler = Scheduler(cfg)
    scheduler.add_request(seq("a", 12, 16))
    scheduler.add_request(seq("b", 12, 16))
    preempted_at = None
    for step in range(100):
        result = scheduler.step()
        if result.output.preempted_ids:
            preempted_at = step
            break
    assert preempted_at is not None and result.output.preempted_ids == ("b",)
    b = scheduler.requests["b"]
    assert b.status is SeqStatus.PREEMPTED and b.num_computed_tokens == 0
    assert b.num_owned_blocks == 0 and b.num_output_tokens > 0
    assert scheduler.waiting[0] is b
    # The preempting step ran "a" alone; its new block came from b's freed blocks.
    assert list(result.output.num_scheduled_tokens) == ["a"]
    held = sum(s.num_owned_blocks for s in scheduler.running)
    assert held + scheduler.block_pool.num_free == cfg.num_usable_blocks
    # b resumes once a finishes, recomputing prompt and output so far, and finishes.
    run_workload(scheduler, {})
    assert b.status is SeqStatus.FINISHED and b.num_output_tokens == 16
    assert scheduler.num_preemptions >= 1


def test_watermark_holds_back_admissions() -> None:
    cfg = config(num_total_blocks=40, watermark=0.25, max_num_batched_tokens=64)
    scheduler = Scheduler(cfg)
    scheduler.add_request(seq("a", 64, 4))   # 16 blocks: admitted, nothing else running
    scheduler.add_request(seq("b", 64, 4))   # 16 more would leave 8 < 10 watermark blocks
    scheduler.step()
    assert [s.request_id for s in scheduler.running] == ["a"]
    assert [s.request_id for s in scheduler.waiting] == ["b"]


def test_whole_input_must_fit_before_admission() -> None:
    def scheduler_with(cfg: InstanceConfig) -> Scheduler:
        # "busy" holds 22 of 32 usable blocks; 10 are free.
        scheduler = Scheduler(cfg, num_free_blocks=10)
        scheduler.restore_running(SeqState("busy", 87, 50, num_output_tokens=1,
                                           num_computed_tokens=87, num_owned_blocks=22))
        scheduler.add_request(seq("long", 60, 2))  # 15 blocks in all, 4 for its first chunk
        return scheduler

    cfg = config(num_total_blocks=33, block_size=4, max_num_batched_tokens=16)
    assert scheduler_with(cfg).step().output.num_scheduled_tokens == {"busy": 1}
    relaxed = InstanceConfig(**{**_fields(cfg), "reserve_full_input": False})
    assert scheduler_with(relaxed).step().output.num_scheduled_tokens == {"busy": 1, "long": 15}


def test_prefix_cache_hits_skip_computation() -> None:
    cfg = config(enable_prefix_caching=True, max_num_batched_tokens=64)
    scheduler = Scheduler(cfg)
    scheduler.add_request(seq("hit", 40, 2, cached=40))
    output = scheduler.step().output
    # Whole blocks up to one token short of the prompt are reused: 36 of 40.
    assert output.num_scheduled_tokens == {"hit": 4}
    assert scheduler.requests["hit"].num_shared_blocks == 9


def test_preempted_request_reuses_its_surviving_blocks_with_prefix_caching() -> None:
    cfg = config(num_total_blocks=9, block_size=4, max_model_len=32, enable_prefix_caching=True)
    scheduler = Scheduler(cfg)
    scheduler.add_request(seq("a", 12, 16))
    scheduler.add_request(seq("b", 12, 16))
    while not scheduler.step().output.preempted_ids:
        pass
    assert scheduler.block_pool.num_cached("b") > 0
    while scheduler.requests["b"].status is not SeqStatus.RUNNING:
        result = scheduler.step()
    resumed = result.output.num_scheduled_tokens["b"]
    assert resumed < scheduler.requests["b"].num_tokens  # part of it came from the cache


def test_duplicate_and_complete_requests_are_rejected() -> None:
    scheduler = Scheduler(config())
    scheduler.add_request(seq("a", 4, 2))
    with pytest.raises(ValueError, match="duplicate"):
        scheduler.add_request(seq("a", 4, 2))
    with pytest.raises(ValueError, match="all its output"):
        scheduler.add_request(SeqState("b", 4, 2, num_output_tokens=2))


def _fields(cfg: InstanceConfig) -> dict:
    return {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}
