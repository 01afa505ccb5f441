"""What-if predictions: the event-driven engine against the step-by-step reference, and sense."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from workers.sim import (
    BatchStats,
    ExecModel,
    FutureLoad,
    InstanceConfig,
    InstanceSnapshot,
    OverrunPolicy,
    SimRequest,
    WhatIf,
    bundled_model,
    estimate_future_load,
    predict_what_if,
    predict_what_if_prepared,
    predict_what_if_stepwise,
    prepare,
    target_output_tokens,
)
from workers.sim.fastsim import FastSim
from workers.sim.snapshot import with_waiting

from .cases import random_case

A30_QWEN = InstanceConfig(num_total_blocks=7289, block_size=16, max_num_seqs=48,
                          max_num_batched_tokens=512, max_model_len=4096)


def assert_same(fast: WhatIf, reference: WhatIf) -> None:
    assert (fast.num_steps, fast.num_preemptions) == (reference.num_steps,
                                                      reference.num_preemptions)
    for name in ("ttft_s", "e2e_s", "queueing_s", "delay_to_others_s"):
        assert math.isclose(getattr(fast, name), getattr(reference, name),
                            rel_tol=1e-9, abs_tol=1e-9), name


@pytest.mark.parametrize("seed", range(10))
def test_event_driven_equals_step_by_step_on_random_snapshots(seed: int,
                                                              toy_model: ExecModel) -> None:
    rng = random.Random(seed)
    for _ in range(40):
        snapshot, new = random_case(rng)
        assert_same(predict_what_if(snapshot, new, toy_model),
                    predict_what_if_stepwise(snapshot, new, toy_model))


def sharegpt_like_case(rng: random.Random, num_running: int, config: InstanceConfig,
                       ) -> tuple[InstanceSnapshot, SimRequest]:
    """A busy large instance with heavy-tailed lengths (lognormal, like ShareGPT)."""
    def lengths() -> tuple[int, int]:
        prompt = min(int(rng.lognormvariate(5.0, 1.0)) + 1, 2000)
        return prompt, min(int(rng.lognormvariate(5.3, 0.9)) + 1, 4000 - prompt)

    requests, held = [], 0
    for i in range(num_running):
        prompt, output = lengths()
        generated = rng.randrange(output)
        computed = prompt + generated - 1 if generated else rng.randrange(prompt)
        if held + -(-computed // config.block_size) > config.num_usable_blocks:
            break
        held += -(-computed // config.block_size)
        requests.append(SimRequest(f"r{i}", prompt, computed, generated,
                                   round(output * rng.uniform(0.7, 1.3)), True))
    for i in range(num_running // 4):
        prompt, output = lengths()
        requests.append(SimRequest(f"w{i}", prompt, 0, 0, output, False))
    prompt, output = lengths()
    snapshot = InstanceSnapshot(config, config.num_usable_blocks - held, tuple(requests))
    return snapshot, SimRequest("new", prompt, predicted_output_tokens=output)


@pytest.mark.parametrize("num_blocks", [7289, 600])
def test_event_driven_equals_step_by_step_on_busy_a30_instances(num_blocks: int) -> None:
    model = bundled_model("qwen2-7b-a30")
    config = InstanceConfig(**{**_fields(A30_QWEN), "num_total_blocks": num_blocks})
    rng = random.Random(num_blocks)
    preemptions = 0
    for num_running in (8, 24, 48, 48):
        snapshot, new = sharegpt_like_case(rng, num_running, config)
        fast = predict_what_if(snapshot, new, model)
        assert_same(fast, predict_what_if_stepwise(snapshot, new, model))
        preemptions += fast.num_preemptions
    if num_blocks == 600:
        assert preemptions > 0  # the small cache exercises preemption


def test_the_last_decode_phases_drained_at_once_give_the_same_figures(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Once only decodes remain and the blocks cover them, the what-if runs the phases up to
    the new request's last token in one loop (`FastSim._drain`): bit for bit what running
    them one by one gives, on busy instances with and without room."""
    model = bundled_model("qwen2-7b-a30")
    rng = random.Random(7)
    cases = [sharegpt_like_case(rng, num_running, InstanceConfig(
        **{**_fields(A30_QWEN), "num_total_blocks": num_blocks}))
        for num_blocks in (7289, 600) for num_running in (1, 8, 24, 48, 48)]
    drained = 0
    drain = FastSim._drain

    def counted(self: FastSim) -> None:
        nonlocal drained
        drained += 1
        drain(self)

    monkeypatch.setattr(FastSim, "_drain", counted)
    at_once = [predict_what_if(snapshot, new, model) for snapshot, new in cases]
    monkeypatch.setattr(FastSim, "_drainable", lambda self: False)
    one_by_one = [predict_what_if(snapshot, new, model) for snapshot, new in cases]
    assert at_once == one_by_one
    assert drained >= len(cases) // 2


def test_a_prepared_snapshot_answers_many_new_requests(toy_model: ExecModel) -> None:
    snapshot, _ = sharegpt_like_case(random.Random(3), 24, A30_QWEN)
    instance = prepare(snapshot)
    for prompt, output in [(10, 5), (500, 300), (3000, 1000)]:
        new = SimRequest("new", prompt, predicted_output_tokens=output)
        assert predict_what_if_prepared(instance, new, toy_model) == predict_what_if(
            snapshot, new, toy_model)


@pytest.mark.parametrize("seed", range(4))
def test_what_ifs_on_one_prepared_snapshot_do_not_disturb_each_other(
        seed: int, toy_model: ExecModel) -> None:
    """A prepared instance keeps its restored decodes for every what-if on it (`FastSim`):
    what-ifs that preempt, finish and re-anchor them must leave the next one unchanged."""
    rng = random.Random(300 + seed)
    for _ in range(30):
        snapshot, new = random_case(rng, max_running=12, max_waiting=4)
        other = dataclasses.replace(new, num_prompt_tokens=max(1, new.num_prompt_tokens // 2),
                                    predicted_output_tokens=3 * new.predicted_output_tokens)
        instance = prepare(snapshot)
        reused = [predict_what_if_prepared(instance, request, toy_model)
                  for request in (new, other, new, other)]
        fresh = [predict_what_if(snapshot, request, toy_model)
                 for request in (new, other, new, other)]
        assert reused == fresh
        assert dataclasses.replace(instance).derived == {}  # never shared by a copy


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_waiting_requests_queued_after_a_prepared_snapshot_as_prepare_queues_them(
        policy: str) -> None:
    """`with_waiting` (a router's requests routed since a publication) gives what `prepare`
    gives for the snapshot with them appended, ties in priority in published order."""
    rng = random.Random(11)
    for _ in range(60):
        snapshot, _new = random_case(rng, max_running=8, max_waiting=5)
        config = dataclasses.replace(snapshot.config, scheduling_policy=policy)
        snapshot = dataclasses.replace(snapshot, config=config, requests=tuple(
            dataclasses.replace(r, priority=rng.choice([0, 5, 9])) for r in snapshot.requests))
        routed = tuple(SimRequest(f"a{i}", rng.randint(1, config.max_model_len - 1),
                                  predicted_output_tokens=rng.randint(1, 50),
                                  priority=rng.choice([0, 5, 9])) for i in range(rng.randint(1, 4)))
        whole = prepare(dataclasses.replace(snapshot, requests=snapshot.requests + routed))
        assert with_waiting(prepare(snapshot), routed) == whole
    with pytest.raises(ValueError, match="unique"):
        with_waiting(whole, routed[:1])


def test_idle_instance_timeline_by_hand(toy_model: ExecModel) -> None:
    snapshot = InstanceSnapshot(A30_QWEN, A30_QWEN.num_usable_blocks)
    result = predict_what_if(snapshot, SimRequest("new", 100, predicted_output_tokens=3),
                             toy_model)
    prefill = toy_model.step_ms(BatchStats(100, 0, 1, 0, 0, 100 * 100)) / 1000
    decodes = [toy_model.step_ms(BatchStats(num_decode_seqs=1, decode_context_tokens=n)) / 1000
               for n in (101, 102)]
    assert result.queueing_s == 0.0
    assert result.ttft_s == pytest.approx(prefill)
    assert result.e2e_s == pytest.approx(prefill + sum(decodes))
    assert result.delay_to_others_s == 0.0
    assert result.num_steps == 3


def test_a_full_batch_makes_the_new_request_queue(toy_model: ExecModel) -> None:
    config = InstanceConfig(**{**_fields(A30_QWEN), "max_num_seqs": 2})
    busy = (SimRequest("r0", 50, 59, 10, 40, True), SimRequest("r1", 50, 59, 10, 60, True))
    snapshot = InstanceSnapshot(config, config.num_usable_blocks - 8, busy)
    result = predict_what_if(snapshot, SimRequest("new", 10, predicted_output_tokens=5),
                             toy_model)
    # It starts when r0 has produced its 30 remaining tokens.
    assert result.num_steps == 30 + 5
    assert result.queueing_s > 0 and result.ttft_s > result.queueing_s
    assert result.delay_to_others_s > 0  # r1 shares steps with it


def test_more_load_means_later_completion(toy_model: ExecModel) -> None:
    rng = random.Random(7)
    light, _ = sharegpt_like_case(rng, 8, A30_QWEN)
    heavy, _ = sharegpt_like_case(rng, 48, A30_QWEN)
    new = SimRequest("new", 300, predicted_output_tokens=200)
    assert (predict_what_if(light, new, toy_model).e2e_s
            < predict_what_if(heavy, new, toy_model).e2e_s)


def test_prefix_caching_reduces_ttft(toy_model: ExecModel) -> None:
    cached = InstanceConfig(**{**_fields(A30_QWEN), "enable_prefix_caching": True})
    busy = tuple(SimRequest(f"r{i}", 1000, 1000 + 4, 5, 100, True) for i in range(4))
    snapshot = InstanceSnapshot(cached, cached.num_usable_blocks - 4 * 63, busy)
    cold = SimRequest("new", 2000, predicted_output_tokens=10)
    warm = SimRequest("new", 2000, predicted_output_tokens=10, num_cached_tokens=1800)
    cold_ttft = predict_what_if(snapshot, cold, toy_model).ttft_s
    assert predict_what_if(snapshot, warm, toy_model).ttft_s < 0.5 * cold_ttft
    no_cache = InstanceSnapshot(A30_QWEN, snapshot.num_free_blocks, busy)
    assert predict_what_if(no_cache, warm, toy_model).ttft_s == pytest.approx(
        predict_what_if(no_cache, cold, toy_model).ttft_s)


def test_requests_past_their_prediction_get_a_margin_not_a_negative_length() -> None:
    config = A30_QWEN
    overrun = OverrunPolicy(margin_fraction=0.25, min_margin_tokens=8)
    on_track = SimRequest("a", 100, 139, 40, predicted_output_tokens=60, is_running=True)
    outran = SimRequest("b", 100, 199, 100, predicted_output_tokens=60, is_running=True)
    barely = SimRequest("c", 100, 109, 10, predicted_output_tokens=10, is_running=True)
    unknown = SimRequest("d", 100, 149, 50, predicted_output_tokens=None, is_running=True)
    capped = SimRequest("e", 4000, 4089, 90, predicted_output_tokens=500, is_running=True)
    assert target_output_tokens(on_track, config, overrun) == 60
    assert target_output_tokens(outran, config, overrun) == 125
    assert target_output_tokens(barely, config, overrun) == 18
    assert target_output_tokens(unknown, config, overrun) == 63
    assert target_output_tokens(capped, config, overrun) == 96


def test_misuse_is_rejected(toy_model: ExecModel) -> None:
    snapshot = InstanceSnapshot(A30_QWEN, 7288, (SimRequest("a", 10, 0, 0, 5, False),))
    with pytest.raises(ValueError, match="predicted output length"):
        predict_what_if(snapshot, SimRequest("new", 10), toy_model)
    with pytest.raises(ValueError, match="already in the snapshot"):
        predict_what_if(snapshot, SimRequest("a", 10, predicted_output_tokens=3), toy_model)
    with pytest.raises(ValueError, match="max_model_len"):
        predict_what_if(snapshot, SimRequest("new", 4096, predicted_output_tokens=3), toy_model)
    with pytest.raises(ValueError, match="num_free_blocks"):
        InstanceSnapshot(A30_QWEN, 7289)  # one block is vLLM's null block
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        InstanceConfig(100, 16, 64, 32, 1024)


def _fields(config: InstanceConfig) -> dict:
    return {f: getattr(config, f) for f in config.__dataclass_fields__}


# -- expected future load ------------------------------------------------------------------

def random_future(rng: random.Random) -> FutureLoad:
    return FutureLoad(rng.choice([2.0, 20.0, 200.0]), rng.uniform(1, 60),
                      rng.uniform(1, 60), phase=rng.choice([0.0, 0.5, 1.0]))


@pytest.mark.parametrize("seed", range(10))
def test_future_load_event_driven_equals_step_by_step(seed: int, toy_model: ExecModel) -> None:
    rng = random.Random(1000 + seed)
    arrived = 0
    for _ in range(30):
        snapshot, new = random_case(rng)
        future = random_future(rng)
        fast = predict_what_if(snapshot, new, toy_model, future=future)
        assert_same(fast, predict_what_if_stepwise(snapshot, new, toy_model, future=future))
        arrived += fast.e2e_s > future.arrival_s(0)
    assert arrived > 10  # most cases see arrivals during the new request's lifetime


@pytest.mark.parametrize("num_blocks", [7289, 600])
def test_future_load_event_driven_equals_step_by_step_on_busy_a30_instances(
        num_blocks: int) -> None:
    model = bundled_model("qwen2-7b-a30")
    config = InstanceConfig(**{**_fields(A30_QWEN), "num_total_blocks": num_blocks})
    rng = random.Random(num_blocks)
    for num_running, rate in ((8, 3.0), (24, 1.0), (48, 3.0), (48, 10.0)):
        snapshot, new = sharegpt_like_case(rng, num_running, config)
        future = FutureLoad(rate, 250.0, 330.0)
        assert_same(predict_what_if(snapshot, new, model, future=future),
                    predict_what_if_stepwise(snapshot, new, model, future=future))


def test_zero_future_rate_leaves_the_what_if_unchanged(toy_model: ExecModel) -> None:
    rng = random.Random(5)
    for _ in range(50):
        snapshot, new = random_case(rng)
        plain = predict_what_if(snapshot, new, toy_model)
        assert predict_what_if(snapshot, new, toy_model, future=FutureLoad()) == plain
        assert predict_what_if(snapshot, new, toy_model,
                               future=FutureLoad(0.0, 100.0, 50.0)) == plain
        assert predict_what_if_stepwise(snapshot, new, toy_model, future=FutureLoad(
            0.0, 100.0, 50.0)) == predict_what_if_stepwise(snapshot, new, toy_model)


@pytest.mark.parametrize("num_running", [0, 8, 24, 48])
def test_more_future_load_means_later_completion(num_running: int) -> None:
    model = bundled_model("qwen2-7b-a30")
    snapshot, new = sharegpt_like_case(random.Random(num_running), num_running, A30_QWEN)
    instance = prepare(snapshot)
    e2e = [predict_what_if_prepared(instance, new, model,
                                    FutureLoad(rate, 250.0, 330.0)).e2e_s if rate else
           predict_what_if_prepared(instance, new, model).e2e_s
           for rate in (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)]
    assert e2e == sorted(e2e)
    assert e2e[-1] > 1.05 * e2e[0]


def test_future_arrivals_queue_behind_the_new_request(toy_model: ExecModel) -> None:
    # One seat: arrivals can only wait behind the new request, so nothing changes for it.
    config = InstanceConfig(**{**_fields(A30_QWEN), "max_num_seqs": 1})
    busy = (SimRequest("r0", 50, 59, 10, 40, True),)
    snapshot = InstanceSnapshot(config, config.num_usable_blocks - 4, busy)
    new = SimRequest("new", 10, predicted_output_tokens=5)
    plain = predict_what_if(snapshot, new, toy_model)
    loaded = predict_what_if(snapshot, new, toy_model, future=FutureLoad(1000.0, 100.0, 50.0))
    assert loaded == plain


def test_estimate_future_load_from_recent_arrivals() -> None:
    arrivals = [(0.5, 100, 10), (9.0, 300, 30), (9.5, 200, None), (10.0, 999, 999)]
    load = estimate_future_load(arrivals, now=10.0, window_s=2.0)
    assert load.rate_per_s == pytest.approx(1.0)  # two in [8, 10); the one at 10 is not past
    assert (load.num_prompt_tokens, load.num_output_tokens) == (250.0, 30.0)
    # A router that began observing 1 s ago divides by what it saw.
    assert estimate_future_load(arrivals, 10.0, 2.0, since=9.0).rate_per_s == pytest.approx(2.0)
    assert not estimate_future_load(arrivals, 10.0, 0.0).active
    assert not estimate_future_load(arrivals, 5.0, 2.0).active  # nothing recent
    with pytest.raises(ValueError, match="positive rate"):
        FutureLoad(1.0, 0.0, 10.0)
    with pytest.raises(ValueError, match="rate_per_s"):
        FutureLoad(-1.0)
