"""VllmEngine against the real vLLM engine (CPU build) serving the tiny random-weight model."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from workers.serve.engine import (
    Engine,
    EngineStopped,
    GenerationRequest,
    GenerationResult,
    RequestRejected,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
SAMPLE_PROMPTS = REPO_ROOT / "app" / "demo" / "sample_prompts.jsonl"
RESULT_TIMEOUT_S = 60


def _prompt(text: str) -> str:
    """A prompt rendered with the tiny model's chat template."""
    return f"<|user|>\n{text}\n<|assistant|>\n"


def _sample_prompts() -> list[dict]:
    with SAMPLE_PROMPTS.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _wait_until(predicate, timeout_s: float = RESULT_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)


# --------------------------------------------------------------------------- sample prompts


def test_sample_prompts_file_is_valid():
    samples = _sample_prompts()
    assert len(samples) >= 200
    for sample in samples:
        assert set(sample) == {"prompt", "max_tokens", "source"}
        assert isinstance(sample["prompt"], str) and 0 < len(sample["prompt"]) <= 1500
        assert isinstance(sample["max_tokens"], int) and 16 <= sample["max_tokens"] <= 192
        assert isinstance(sample["source"], str) and sample["source"]
    assert len({s["prompt"] for s in samples}) == len(samples)
    assert len({s["max_tokens"] for s in samples}) > 20  # output lengths vary


def test_submit_before_start_raises():
    from workers.serve.vllm_engine import VllmEngine, VllmEngineConfig

    engine = VllmEngine(VllmEngineConfig(model="never-loaded"))  # nothing is built before start()
    with pytest.raises(EngineStopped):
        engine.submit(GenerationRequest("never", "hi", max_tokens=4))
    assert not engine.alive
    with pytest.raises(ValueError):
        VllmEngineConfig(model="m", max_num_seqs=0)


# --------------------------------------------------------------------------- the real engine


@pytest.mark.vllm
def test_engine_satisfies_protocol(vllm_engine):
    assert isinstance(vllm_engine, Engine)
    assert vllm_engine.alive


@pytest.mark.vllm
def test_request_completes_with_counts_and_ordered_timestamps(
    vllm_engine, engine_listener, tiny_model_dir
):
    from transformers import AutoTokenizer

    prompt = _prompt("Write a haiku about queues.")
    result = vllm_engine.submit(
        GenerationRequest("single", prompt, max_tokens=24)
    ).result(RESULT_TIMEOUT_S)

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    assert result.request_id == "single"
    assert result.num_prompt_tokens == len(tokenizer(prompt)["input_ids"])
    assert 1 <= result.num_output_tokens <= 24
    assert result.finish_reason in ("stop", "length")
    assert result.first_token_at is not None
    assert result.admitted_at <= result.first_token_at <= result.finished_at
    assert engine_listener.first_tokens["single"] == result.first_token_at
    assert "".join(engine_listener.deltas.get("single", [])) == result.output_text


@pytest.mark.vllm
def test_max_tokens_is_respected(vllm_engine):
    max_tokens = 8
    futures = [
        vllm_engine.submit(
            GenerationRequest(f"max-{i}", _prompt(s["prompt"]), max_tokens=max_tokens)
        )
        for i, s in enumerate(_sample_prompts()[:6])
    ]
    results = [f.result(RESULT_TIMEOUT_S) for f in futures]
    for result in results:
        assert result.num_output_tokens <= max_tokens
        if result.finish_reason == "length":
            assert result.num_output_tokens == max_tokens
        else:
            assert result.finish_reason == "stop"  # the random model may sample EOS
    assert any(r.finish_reason == "length" for r in results)


@pytest.mark.vllm
def test_concurrent_submits_are_batched(vllm_engine, engine_listener):
    num_threads = 24
    samples = _sample_prompts()[:num_threads]
    barrier = threading.Barrier(num_threads)
    results: dict[int, GenerationResult] = {}
    errors: list[BaseException] = []
    first_step = len(engine_listener.steps)

    def client(i: int) -> None:
        try:
            barrier.wait()
            request = GenerationRequest(
                f"conc-{i}", _prompt(samples[i]["prompt"]), max_tokens=32, priority=i % 2
            )
            results[i] = vllm_engine.submit(request).result(RESULT_TIMEOUT_S)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(num_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RESULT_TIMEOUT_S)

    assert not errors
    assert len(results) == num_threads
    assert all(r.num_output_tokens >= 1 for r in results.values())
    steps = engine_listener.steps[first_step:]
    assert max(s.num_seqs for s in steps) > 1
    assert sum(s.num_decode_tokens for s in steps) > 0
    assert sum(s.num_prefill_tokens for s in steps) >= sum(
        r.num_prompt_tokens for r in results.values()
    )
    assert all(0.0 <= s.kv_cache_usage <= 1.0 and s.duration_ms > 0 for s in steps)


@pytest.mark.vllm
def test_duplicate_submit_returns_the_same_future(vllm_engine, engine_listener):
    request = GenerationRequest("dup", _prompt("Say it once."), max_tokens=16)
    first = vllm_engine.submit(request)
    second = vllm_engine.submit(request)
    assert second is first
    result = first.result(RESULT_TIMEOUT_S)
    # A redelivery after completion gets the finished result, not a second generation.
    assert vllm_engine.submit(request) is first
    assert "".join(engine_listener.deltas.get("dup", [])) == result.output_text


@pytest.mark.vllm
def test_abort_resolves_the_future_with_abort(vllm_engine, engine_listener):
    request = GenerationRequest(
        "to-abort", _prompt("Go on forever."), max_tokens=1900, temperature=0.0
    )
    future: Future[GenerationResult] = vllm_engine.submit(request)
    assert engine_listener.event_for("to-abort").wait(RESULT_TIMEOUT_S)

    vllm_engine.abort("to-abort")
    result = future.result(RESULT_TIMEOUT_S)
    assert result.finish_reason == "abort"
    assert 1 <= result.num_output_tokens < 1900
    assert all(r.request_id != "to-abort" for r in vllm_engine.snapshot().requests)
    vllm_engine.abort("no-such-request")  # unknown ids are ignored
    # The engine keeps serving.
    after = vllm_engine.submit(GenerationRequest("after-abort", _prompt("hi"), max_tokens=4))
    assert after.result(RESULT_TIMEOUT_S).num_output_tokens >= 1


@pytest.mark.vllm
def test_snapshot_reports_blocks_and_requests_in_flight(vllm_engine, engine_listener):
    idle = vllm_engine.snapshot()
    assert idle.engine_kind == "vllm"
    assert idle.num_total_blocks > 0
    assert 0 <= idle.num_free_blocks <= idle.num_total_blocks
    assert idle.block_size == 32
    assert (idle.max_num_seqs, idle.max_num_batched_tokens, idle.max_model_len) == (48, 512, 2048)

    request = GenerationRequest(
        "snap",
        _prompt("Describe the sea. " * 20),
        max_tokens=1500,
        temperature=0.0,  # greedy: deterministic, so no early EOS by chance
        predicted_output_tokens=300,
    )
    future = vllm_engine.submit(request)
    assert engine_listener.event_for("snap").wait(RESULT_TIMEOUT_S)
    _wait_until(lambda: any(r.num_output_tokens > 4 for r in vllm_engine.snapshot().requests))
    busy = vllm_engine.snapshot()
    (state,) = [r for r in busy.requests if r.request_id == "snap"]
    assert state.is_running
    assert state.predicted_output_tokens == 300
    assert state.num_prompt_tokens > 20
    assert state.num_computed_tokens >= state.num_prompt_tokens
    assert busy.num_running >= 1
    assert busy.num_free_blocks < busy.num_total_blocks
    assert busy.taken_at >= idle.taken_at

    vllm_engine.abort("snap")
    future.result(RESULT_TIMEOUT_S)
    _wait_until(lambda: vllm_engine.snapshot().num_running == 0)
    assert not vllm_engine.snapshot().requests


@pytest.mark.vllm
def test_a_bad_request_fails_alone(vllm_engine):
    too_long = GenerationRequest("too-long", "word " * 5000, max_tokens=4)
    with pytest.raises(RequestRejected, match="maximum context length"):
        vllm_engine.submit(too_long).result(RESULT_TIMEOUT_S)
    with pytest.raises(ValueError):
        vllm_engine.submit(GenerationRequest("zero", "hi", max_tokens=0))
    ok = vllm_engine.submit(GenerationRequest("fine", _prompt("hi"), max_tokens=4))
    assert ok.result(RESULT_TIMEOUT_S).num_output_tokens >= 1


@pytest.mark.vllm
def test_stop_fails_pending_requests(vllm_engine, tiny_model_dir):
    """A second, short-lived engine (the session one stays up): stop() fails what is pending."""
    from workers.serve.vllm_engine import VllmEngine, VllmEngineConfig

    config = VllmEngineConfig(model=str(tiny_model_dir), block_size=32, kv_cache_gib=0.05)
    engine = VllmEngine(config)
    engine.start()
    try:
        pending = engine.submit(
            GenerationRequest("pending", _prompt("Ramble."), max_tokens=1900, temperature=0.0)
        )
    finally:
        engine.stop()
    with pytest.raises(EngineStopped):
        pending.result(RESULT_TIMEOUT_S)
    assert not engine.alive
    with pytest.raises(EngineStopped):
        engine.submit(GenerationRequest("late", "hi", max_tokens=4))
    assert vllm_engine.alive  # the session engine is unaffected
