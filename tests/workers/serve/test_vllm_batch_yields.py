"""vLLM beside batch work: seats kept for interactive requests (batch requests wait in the
engine's own list while max_num_seqs - num_interactive_seats requests are in vLLM, so an
interactive arrival beside a batch that would fill every seat runs at once), and batch prefills
last (our scheduler subclass: an interactive arrival goes before a running batch line's long
prefill). Runs the tiny model on CPU (marked vllm)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.workers.serve.recording import RecordingListener
from workers.serve.engine import GenerationRequest, SamplingOptions

RESULT_TIMEOUT_S = 120
MAX_NUM_SEQS = 4
NUM_SEATS = 1


@pytest.fixture(scope="session")
def listener() -> RecordingListener:
    return RecordingListener()


# NOTE: session-scoped, so it stops after every test: stopping a vLLM engine tears down vLLM's
# process-wide state, and no vLLM engine can step in this process afterwards (see conftest).
@pytest.fixture(scope="session")
def reserving_engine(tiny_model_dir: Path, listener: RecordingListener) -> Iterator:
    pytest.importorskip("vllm")
    from workers.serve.vllm_engine import VllmEngine, VllmEngineConfig

    engine = VllmEngine(VllmEngineConfig(
        model=str(tiny_model_dir), block_size=32, kv_cache_gib=0.25, max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=512, max_model_len=2048, num_interactive_seats=NUM_SEATS,
        batch_prefill_last=True),
        listener)
    engine.start()
    yield engine
    engine.stop()


def _request(request_id: str, max_tokens: int, priority: int) -> GenerationRequest:
    return GenerationRequest(request_id, "the quick brown fox " * 8, max_tokens=max_tokens,
                             priority=priority, sampling=SamplingOptions(ignore_eos=True))


@pytest.mark.vllm
def test_an_interactive_request_is_seated_beside_batch_work(reserving_engine,
                                                            listener: RecordingListener) -> None:
    engine = reserving_engine
    batch = [engine.submit(_request(f"b{i}", 400, priority=1)) for i in range(8)]
    deadline = time.monotonic() + RESULT_TIMEOUT_S
    while True:  # until the batch runs in the seats it may take and decodes
        snap = engine.snapshot()
        running = [r for r in snap.requests if r.is_running]
        if len(running) == MAX_NUM_SEQS - NUM_SEATS and all(r.num_output_tokens
                                                            for r in running):
            break
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert snap.num_interactive_seats == NUM_SEATS
    # The held batch requests are published as waiting, with their prompts' lengths.
    waiting = [r for r in snap.requests if not r.is_running]
    assert len(waiting) == 8 - (MAX_NUM_SEQS - NUM_SEATS)
    assert all(r.num_prompt_tokens > 0 for r in waiting)
    num_steps_before = len(listener.steps)
    done = engine.submit(_request("i", 4, priority=0)).result(RESULT_TIMEOUT_S)
    first_token_at = done.first_token_at
    with listener.lock:
        num_steps = sum(1 for s in listener.steps[num_steps_before:] if s.at <= first_token_at)
    assert num_steps <= 3  # a seat was free: no wait for a 400-token batch answer
    assert done.num_output_tokens == 4
    # A held batch request (the last to be released) aborts without ever reaching vLLM; the
    # others all run.
    held_id = waiting[-1].request_id
    engine.abort(held_id)
    for i, future in enumerate(batch):
        result = future.result(RESULT_TIMEOUT_S)
        if f"b{i}" == held_id:
            assert (result.finish_reason, result.num_output_tokens) == ("abort", 0)
        else:
            assert result.num_output_tokens == 400


@pytest.mark.vllm
def test_an_interactive_request_goes_before_a_running_batch_prefill(
        reserving_engine, listener: RecordingListener) -> None:
    # A batch line of 2,000 prompt tokens prefills in 512-token chunks (4 steps); an interactive
    # request arriving after its first chunk samples before it (vLLM's own order would give
    # the batch chunks the budget first: running requests before waiting ones).
    engine = reserving_engine
    num_steps_before = len(listener.steps)
    prompt = tuple(5 + (7 * i) % 200 for i in range(2000))
    batch = engine.submit(GenerationRequest("long-b", "", max_tokens=4, priority=1,
                                            prompt_token_ids=prompt,
                                            sampling=SamplingOptions(ignore_eos=True)))
    deadline = time.monotonic() + RESULT_TIMEOUT_S
    while len(listener.steps) == num_steps_before:  # its first chunk ran
        assert time.monotonic() < deadline
        time.sleep(0.0005)
    done = engine.submit(_request("short-i", 4, priority=0)).result(RESULT_TIMEOUT_S)
    long_batch = batch.result(RESULT_TIMEOUT_S)
    assert done.first_token_at < long_batch.first_token_at
    assert engine.snapshot().batch_prefill_last


@pytest.mark.vllm
def test_a_burst_beyond_the_reserve_takes_a_batch_seat(reserving_engine,
                                                       listener: RecordingListener) -> None:
    # The batch holds its 3 seats, a long interactive request takes the reserved one; the
    # next interactive request finds every seat taken and gets the seat of the latest batch
    # line (preempted, recomputed later), instead of waiting ~400 steps for a batch answer.
    engine = reserving_engine
    batch = [engine.submit(_request(f"yb{i}", 400, priority=1)) for i in range(3)]
    _wait_decoding(engine, MAX_NUM_SEQS - NUM_SEATS)
    first = engine.submit(_request("yi0", 200, priority=0))
    _wait_decoding(engine, MAX_NUM_SEQS)  # every seat taken
    num_steps_before = len(listener.steps)
    burst = engine.submit(_request("yi1", 4, priority=0)).result(RESULT_TIMEOUT_S)
    with listener.lock:
        num_steps = sum(1 for s in listener.steps[num_steps_before:]
                        if s.at <= burst.first_token_at)
    assert num_steps <= 3
    assert not first.done()  # it did not give its seat up: a batch line did
    assert first.result(RESULT_TIMEOUT_S).num_output_tokens == 200
    assert [f.result(RESULT_TIMEOUT_S).num_output_tokens for f in batch] == [400] * 3


def _wait_decoding(engine, num_running: int) -> None:
    """Until `num_running` requests run in vLLM, every one of them decoding."""
    deadline = time.monotonic() + RESULT_TIMEOUT_S
    while True:
        running = [r for r in engine.snapshot().requests if r.is_running]
        if len(running) == num_running and all(r.num_output_tokens for r in running):
            return
        assert time.monotonic() < deadline
        time.sleep(0.002)
