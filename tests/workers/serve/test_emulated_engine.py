"""EmulatedEngine beyond the Engine contract (test_engine_contract.py): a simulated vLLM instance,
run fast (scaled time), at the simulator's pace, with its lengths, steps and blocks."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import wait

import pytest

from workers.serve.emulated_engine import EmulatedEngine, EmulatedEngineConfig
from workers.serve.engine import GenerationRequest, RequestRejected
from workers.serve.output_lengths import AnswerLengths, MaxTokensLengths, ShareGptLengths
from workers.sim import InstanceConfig, InstanceSnapshot, SimRequest, predict_what_if

RESULT_TIMEOUT_S = 30
#: 100x faster than real time: a 20 ms decode step takes 0.2 ms.


@pytest.fixture
def make_engine(
        make_emulated_engine: Callable[..., EmulatedEngine]) -> Callable[..., EmulatedEngine]:
    return make_emulated_engine


def _request(request_id: str, max_tokens: int = 16, prompt_tokens: int = 50,
             predicted: int | None = None, priority: int = 0) -> GenerationRequest:
    # approx_token_count: four characters per token.
    return GenerationRequest(request_id, "x" * (4 * prompt_tokens), max_tokens=max_tokens,
                             predicted_output_tokens=predicted, priority=priority)


def test_the_idle_snapshot_says_it_is_emulated(make_engine) -> None:
    engine = make_engine()
    idle = engine.snapshot()
    assert idle.engine_kind == "emulated" and idle.model == "emulated/qwen2-7b-a30"
    # The Block paper's A30 / Qwen2-7B instance; like vLLM, one block is the null block.
    assert (idle.num_total_blocks, idle.num_free_blocks) == (7288, 7288)
    assert (idle.block_size, idle.max_num_seqs, idle.max_num_batched_tokens,
            idle.max_model_len) == (16, 48, 512, 4096)
    assert idle.requests == () and idle.num_running == idle.num_waiting == 0


def test_output_is_synthetic_tokens_up_to_the_drawn_length(make_engine) -> None:
    engine = make_engine()
    result = engine.submit(_request("r1", max_tokens=20, prompt_tokens=30)).result(
        RESULT_TIMEOUT_S)
    assert (result.num_prompt_tokens, result.num_output_tokens) == (30, 20)
    assert result.finish_reason == "length"
    tokens = result.output_text.split()
    assert len(tokens) == 20 and all(t.startswith("tok") for t in tokens)


def test_sharegpt_lengths_are_capped_by_max_tokens_and_fixed_per_request(make_engine) -> None:
    engine = make_engine(output_lengths=ShareGptLengths(seed=7))
    futures = [engine.submit(_request(f"s{i}", max_tokens=60)) for i in range(40)]
    results = [f.result(RESULT_TIMEOUT_S) for f in futures]
    assert all(1 <= r.num_output_tokens <= 60 for r in results)
    stopped = [r for r in results if r.finish_reason == "stop"]
    capped = [r for r in results if r.finish_reason == "length"]
    assert stopped and capped  # ShareGPT answers: about 12% end within 60 tokens
    assert all(r.num_output_tokens < 60 for r in stopped)
    assert all(r.num_output_tokens == 60 for r in capped)
    draw = ShareGptLengths(seed=7)
    for r in stopped:
        assert draw(_request(r.request_id)) == r.num_output_tokens


def test_answer_lengths_replay_the_real_answer_of_the_same_prompt(make_engine, tmp_path) -> None:
    answers = tmp_path / "answers.jsonl"
    answers.write_text(json.dumps({"prompt": "x" * 200, "output_tokens": 37}) + "\n"
                       + json.dumps({"prompt": "x" * 120, "output_tokens": 500}) + "\n")
    lengths = AnswerLengths.from_jsonl(answers)
    engine = make_engine(output_lengths=lengths)
    known = engine.submit(_request("a1", max_tokens=100, prompt_tokens=50)).result(
        RESULT_TIMEOUT_S)
    capped = engine.submit(_request("a2", max_tokens=100, prompt_tokens=30)).result(
        RESULT_TIMEOUT_S)
    assert (known.num_output_tokens, known.finish_reason) == (37, "stop")
    assert (capped.num_output_tokens, capped.finish_reason) == (100, "length")
    unknown = _request("a3", prompt_tokens=7)
    assert lengths(unknown) == ShareGptLengths()(unknown)


def test_output_is_capped_by_max_model_len(make_engine) -> None:
    engine = make_engine(max_model_len=256, num_blocks=64)
    result = engine.submit(_request("long", max_tokens=1000, prompt_tokens=200)).result(
        RESULT_TIMEOUT_S)
    assert result.num_output_tokens == 56 and result.finish_reason == "length"


def test_prompt_longer_than_context_is_rejected(make_engine) -> None:
    engine = make_engine(max_model_len=256, num_blocks=64)
    future = engine.submit(_request("huge", prompt_tokens=256))
    with pytest.raises(RequestRejected, match="max_model_len"):
        future.result(RESULT_TIMEOUT_S)
    with pytest.raises(ValueError):
        engine.submit(_request("zero", max_tokens=0))


def test_concurrent_requests_share_steps(make_engine, recorder) -> None:
    engine = make_engine()
    futures = [engine.submit(_request(f"c{i}", max_tokens=40)) for i in range(32)]
    done, _ = wait(futures, timeout=RESULT_TIMEOUT_S)
    assert len(done) == 32
    assert all(f.result().num_output_tokens == 40 for f in futures)
    widest = max(s.num_seqs for s in recorder.steps)
    assert widest >= 24, widest
    # 32 requests x 40 tokens, batched: far fewer steps than the 1280 a one-by-one engine takes.
    assert len(recorder.steps) < 200, len(recorder.steps)


def test_step_samples_describe_each_step(make_engine, recorder) -> None:
    engine = make_engine()
    engine.submit(_request("p", max_tokens=5, prompt_tokens=700)).result(RESULT_TIMEOUT_S)
    steps = recorder.steps
    # 700 prompt tokens under a 512-token budget: two prefill chunks, then four decodes.
    assert [(s.num_prefill_tokens, s.num_decode_tokens) for s in steps] == [
        (512, 0), (188, 0), (0, 1), (0, 1), (0, 1), (0, 1)]
    # The execution-time model's context features, as the real engine reports them: the second
    # chunk attends to the first's 512 tokens; each decode to its whole sequence, 700 plus the
    # tokens generated so far (the last prefill chunk made the first).
    assert [(s.prefill_chunk_x_context, s.prefill_chunk_sq) for s in steps[:2]] == [
        (0, 512 * 512), (188 * 512, 188 * 188)]
    assert [s.decode_context_tokens for s in steps[2:]] == [701, 702, 703, 704]
    assert all(s.num_seqs == 1 and s.duration_ms > 0 for s in steps)
    assert all(0 < s.kv_cache_usage < 1 for s in steps[:-1])
    assert steps[-1].num_running == 0 and steps[-1].kv_cache_usage == 0.0
    assert [s.at for s in steps] == sorted(s.at for s in steps)


def test_runs_at_the_emulated_pace_and_agrees_with_the_simulator(make_engine, recorder) -> None:
    """Noise off: one request alone takes what the what-if simulator predicts, times the scale."""
    scale = 0.05
    engine = make_engine(time_scale=scale)
    started = time.monotonic()
    result = engine.submit(_request("t", max_tokens=60, prompt_tokens=900)).result(
        RESULT_TIMEOUT_S)
    elapsed_s = time.monotonic() - started
    config = InstanceConfig(7289, 16, 48, 512, 4096)
    predicted = predict_what_if(InstanceSnapshot(config, config.num_usable_blocks),
                                SimRequest("t", 900, predicted_output_tokens=60),
                                engine.exec_model)
    emulated_s = sum(s.duration_ms for s in recorder.steps) / 1000.0
    assert emulated_s == pytest.approx(predicted.e2e_s * scale, rel=1e-6)
    actual_e2e = result.finished_at - result.admitted_at
    assert emulated_s * 0.95 <= actual_e2e <= emulated_s * 1.5 + 0.05, (actual_e2e, emulated_s)
    assert elapsed_s >= emulated_s * 0.95


def test_noise_is_seeded_multiplicative(recorder) -> None:
    def durations(seed: int) -> list[float]:
        engine = EmulatedEngine(EmulatedEngineConfig(time_scale=0.001, noise=0.2, seed=seed,
                                                     output_lengths=MaxTokensLengths()), recorder)
        engine.start()
        try:
            engine.submit(_request("n", max_tokens=30)).result(RESULT_TIMEOUT_S)
        finally:
            engine.stop()
        with recorder.lock:
            taken = [s.duration_ms for s in recorder.steps]
            recorder.steps.clear()
        return taken

    first, again, other = durations(1), durations(1), durations(2)
    assert first == again and first != other
    decode = first[1:]  # ~20 ms x 0.001 each, spread by the noise
    assert 0.01 < min(decode) < max(decode) < 0.04
    assert len(set(decode)) == len(decode)


def test_snapshot_tracks_running_and_waiting_requests(make_engine) -> None:
    engine = make_engine(time_scale=0.2, max_num_seqs=2)
    futures = [engine.submit(_request(f"q{i}", max_tokens=400, predicted=123)) for i in range(4)]
    deadline = time.monotonic() + RESULT_TIMEOUT_S
    while True:
        snap = engine.snapshot()
        if snap.num_running == 2 and all(r.num_output_tokens for r in snap.requests[:2]):
            break
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert snap.num_waiting == 2
    assert [r.request_id for r in snap.requests] == ["q0", "q1", "q2", "q3"]
    assert [r.is_running for r in snap.requests] == [True, True, False, False]
    for r in snap.requests[:2]:
        assert r.num_computed_tokens in (50 + r.num_output_tokens - 1, 50 + r.num_output_tokens)
    assert all(r.num_prompt_tokens == 50 and r.predicted_output_tokens == 123
               for r in snap.requests)
    held = sum(-(-r.num_computed_tokens // 16) for r in snap.requests[:2])
    assert snap.num_free_blocks == snap.num_total_blocks - held
    assert not any(f.done() for f in futures)


def test_abort_frees_the_requests_blocks(make_engine, recorder) -> None:
    engine = make_engine(time_scale=0.05)
    future = engine.submit(_request("a", max_tokens=3000, prompt_tokens=600))
    waiting = engine.submit(_request("b", max_tokens=10))  # aborted before or after admission
    engine.abort("b")
    deadline = time.monotonic() + RESULT_TIMEOUT_S
    while "a" not in recorder.first_tokens:
        assert time.monotonic() < deadline
        time.sleep(0.002)
    engine.abort("a")
    assert future.result(RESULT_TIMEOUT_S).finish_reason == "abort"
    assert waiting.result(RESULT_TIMEOUT_S).finish_reason in ("abort", "length")
    snap = engine.snapshot()
    assert snap.requests == () and snap.num_free_blocks == snap.num_total_blocks


def test_tight_kv_cache_preempts_and_still_finishes_everything(make_engine, recorder) -> None:
    # 40 blocks of 16 tokens: 10 requests growing to 300 tokens each cannot all stay resident.
    engine = make_engine(num_blocks=40, max_model_len=512)
    futures = [engine.submit(_request(f"k{i}", max_tokens=200, prompt_tokens=100))
               for i in range(10)]
    results = [f.result(RESULT_TIMEOUT_S) for f in futures]
    assert all(r.num_output_tokens == 200 for r in results)
    assert max(s.kv_cache_usage for s in recorder.steps) > 0.9
    # Preempted requests recompute: more prefill tokens than the prompts hold.
    assert sum(s.num_prefill_tokens for s in recorder.steps) > 10 * 100


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_priority_policy_serves_the_shortest_predicted_first(make_engine, recorder,
                                                             policy: str) -> None:
    # One seat: the first request runs while three wait; under "priority" they start in
    # predicted-length order (1 s per predicted token outweighs the ms between arrivals),
    # under FCFS in arrival order. The state says which policy the what-ifs must model.
    engine = make_engine(max_num_seqs=1, scheduling_policy=policy,
                         priority_ms_per_token=1000.0)
    first = engine.submit(_request("first", max_tokens=2000, predicted=1))  # ~0.4 s
    deadline = time.monotonic() + RESULT_TIMEOUT_S
    while "first" not in recorder.first_tokens:
        assert time.monotonic() < deadline
        time.sleep(0.002)
    futures = [engine.submit(_request(name, max_tokens=4, predicted=predicted))
               for name, predicted in (("long", 400), ("short", 5), ("mid", 50))]
    snap = engine.snapshot()
    # FCFS: every request interactive, priorities in arrival ms (no length term).
    assert snap.scheduling_policy == policy
    assert snap.priority_ms_per_token == (1000.0 if policy == "priority" else 0.0)
    assert snap.instance_config().scheduling_policy == policy
    priorities = {r.request_id: r.priority for r in snap.requests}
    assert (priorities["short"] < priorities["mid"] < priorities["long"] if policy == "priority"
            else priorities["long"] <= priorities["short"] <= priorities["mid"])
    for future in [first, *futures]:
        future.result(RESULT_TIMEOUT_S)
    order = sorted(("long", "short", "mid"), key=recorder.first_tokens.__getitem__)
    assert order == (["short", "mid", "long"] if policy == "priority"
                     else ["long", "short", "mid"])


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_an_interactive_request_overtakes_batch_work_that_fills_the_kv_cache(
        make_engine, recorder, policy: str) -> None:
    # 32 blocks of 16 tokens: three batch requests growing to 500 tokens each cannot stay
    # resident together and keep preempting one another. An interactive request arriving once
    # one was preempted is admitted before the preempted batch requests and, once running, is
    # never the one preempted (vLLM's priority policy: the largest priority goes): it finishes
    # long before any of them. Under plain FCFS it would queue behind them and finish last.
    engine = make_engine(num_blocks=33, max_model_len=512, time_scale=0.05,
                         scheduling_policy=policy)
    batch = [engine.submit(_request(f"b{i}", max_tokens=400, prompt_tokens=100, predicted=400,
                                    priority=1)) for i in range(3)]
    deadline = time.monotonic() + RESULT_TIMEOUT_S
    while True:  # until the KV cache is full: a batch request was preempted, it waits
        snap = engine.snapshot()
        if any(not r.is_running and r.num_output_tokens for r in snap.requests):
            break
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert snap.scheduling_policy == "priority"  # a batch request is in: what-ifs must know
    interactive = engine.submit(_request("i", max_tokens=20, prompt_tokens=50, predicted=20))
    done = interactive.result(RESULT_TIMEOUT_S)
    results = [f.result(RESULT_TIMEOUT_S) for f in batch]
    assert done.num_output_tokens == 20
    assert done.finished_at < min(r.finished_at for r in results)
    assert sum(s.num_prefill_tokens for s in recorder.steps) > 3 * 100 + 50  # preempted batch
    ttft_s = recorder.first_tokens["i"] - done.admitted_at
    assert ttft_s < 0.25 * (min(r.finished_at for r in results) - done.admitted_at)


@pytest.mark.parametrize("num_seats", [0, 2])
def test_a_seat_reserve_seats_an_interactive_arrival_beside_a_full_batch(
        make_engine, recorder, num_seats: int) -> None:
    # 8 seats and 16 batch lines of 300 tokens: with no reserve they take every seat and an
    # interactive arrival waits for one of them to finish its answer (vLLM preempts for KV
    # blocks only, never for a seat); with 2 seats kept, 6 run, 10 wait in the engine, and the
    # interactive request runs in the next step.
    engine = make_engine(max_num_seqs=8, num_interactive_seats=num_seats)
    batch = [engine.submit(_request(f"b{i}", max_tokens=300, prompt_tokens=100, predicted=300,
                                    priority=1)) for i in range(16)]
    deadline = time.monotonic() + RESULT_TIMEOUT_S
    while True:  # until the batch holds the seats it may and decodes
        snap = engine.snapshot()
        if snap.num_running == 8 - num_seats and all(
                r.num_output_tokens for r in snap.requests if r.is_running):
            break
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert snap.num_interactive_seats == num_seats and snap.num_waiting == 8 + num_seats
    num_steps_before = len(recorder.steps)
    done = engine.submit(_request("i", max_tokens=5, prompt_tokens=50)).result(RESULT_TIMEOUT_S)
    first_token_at = recorder.first_tokens["i"]
    with recorder.lock:
        num_steps = sum(1 for s in recorder.steps[num_steps_before:] if s.at <= first_token_at)
    if num_seats:
        assert num_steps <= 2
    else:
        assert num_steps > 100
    assert done.num_output_tokens == 5
    for future in batch:
        assert future.result(RESULT_TIMEOUT_S).num_output_tokens == 300


@pytest.mark.parametrize("last", [False, True])
def test_an_interactive_arrival_goes_before_a_running_batch_prefill(
        make_engine, recorder, last: bool) -> None:
    # A batch line with a 2,000-token prompt prefills in 512-token chunks (4 steps). An
    # interactive request arriving after its first chunk waits for the whole prefill in vLLM's
    # order (running requests first); with batch prefills last it runs in the next step (the
    # one in progress when it arrives aside).
    engine = make_engine(time_scale=0.2, batch_prefill_last=last)
    batch = engine.submit(_request("b", max_tokens=5, prompt_tokens=2000, priority=1))
    deadline = time.monotonic() + RESULT_TIMEOUT_S
    while not recorder.steps:  # its first chunk ran
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert engine.snapshot().batch_prefill_last is last
    num_steps_before = len(recorder.steps)
    done = engine.submit(_request("i", max_tokens=5, prompt_tokens=50)).result(RESULT_TIMEOUT_S)
    batch.result(RESULT_TIMEOUT_S)
    with recorder.lock:
        num_steps = sum(1 for s in recorder.steps[num_steps_before:]
                        if s.at <= recorder.first_tokens["i"])
    if last:
        assert num_steps <= 2 and recorder.first_tokens["i"] < recorder.first_tokens["b"]
    else:
        assert num_steps >= 3 and recorder.first_tokens["i"] >= recorder.first_tokens["b"]
    assert done.num_output_tokens == 5


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        EmulatedEngineConfig(time_scale=0)
    with pytest.raises(ValueError):
        EmulatedEngineConfig(noise=-0.1)
    with pytest.raises(ValueError):
        EmulatedEngineConfig(num_blocks=8, max_model_len=4096)  # cannot hold one sequence
    with pytest.raises(ValueError, match="num_interactive_seats"):
        EmulatedEngineConfig(max_num_seqs=4, num_interactive_seats=4)  # no seat for batch work
    with pytest.raises(ValueError, match="known"):
        EmulatedEngine(EmulatedEngineConfig(exec_model="no-such-gpu"))
    with pytest.raises(ValueError, match="scheduling_policy"):
        EmulatedEngineConfig(scheduling_policy="sjf")
