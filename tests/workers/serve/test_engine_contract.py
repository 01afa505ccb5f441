"""The Engine contract (workers/serve/engine.py), held by both engines: vLLM serving the tiny
random-weight model, and the emulated engine (a simulated A30, run twenty times faster)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.workers.serve.recording import RecordingListener
from workers.serve.emulated_engine import EmulatedEngine, EmulatedEngineConfig
from workers.serve.engine import (
    Engine,
    EngineStopped,
    GenerationRequest,
    GenerationResult,
    RequestRejected,
)
from workers.serve.output_lengths import MaxTokensLengths

REPO_ROOT = Path(__file__).resolve().parents[3]
SAMPLE_PROMPTS = REPO_ROOT / "app" / "demo" / "sample_prompts.jsonl"
RESULT_TIMEOUT_S = 60


@dataclass
class EngineUnderTest:
    """One engine kind, as the contract tests drive it."""

    kind: str  # engine_kind in its snapshots
    engine: Engine  # started, shared by the kind's tests
    listener: RecordingListener  # the engine's listener
    make: Callable[[], Engine]  # another engine of this kind, not started
    prompt: Callable[[str], str]  # a prompt as the engine takes it
    #: (block_size, max_num_seqs, max_num_batched_tokens, max_model_len) of `engine`.
    limits: tuple[int, int, int, int]

    def request(self, request_id: str, text: str, max_tokens: int,
                **options: object) -> GenerationRequest:
        return GenerationRequest(request_id, self.prompt(text), max_tokens=max_tokens,
                                 **options)  # type: ignore[arg-type]


def _chat_prompt(text: str) -> str:
    """A prompt rendered with the tiny model's chat template."""
    return f"<|user|>\n{text}\n<|assistant|>\n"


@pytest.fixture(params=[pytest.param("vllm", marks=pytest.mark.vllm), "emulated"])
def subject(request: pytest.FixtureRequest) -> Iterator[EngineUnderTest]:
    if request.param == "vllm":
        from workers.serve.vllm_engine import VllmEngine, VllmEngineConfig

        model = str(request.getfixturevalue("tiny_model_dir"))
        yield EngineUnderTest(
            "vllm", request.getfixturevalue("vllm_engine"),
            request.getfixturevalue("engine_listener"),
            lambda: VllmEngine(VllmEngineConfig(model=model, block_size=32, kv_cache_gib=0.05)),
            _chat_prompt, (32, 48, 512, 2048))
        return
    config = EmulatedEngineConfig(time_scale=0.05, noise=0.0, output_lengths=MaxTokensLengths())
    listener = RecordingListener()
    engine = EmulatedEngine(config, listener)
    engine.start()
    yield EngineUnderTest("emulated", engine, listener, lambda: EmulatedEngine(config), str,
                          (16, 48, 512, 4096))
    engine.stop()


def _sample_prompts() -> list[str]:
    with SAMPLE_PROMPTS.open(encoding="utf-8") as f:
        return [json.loads(line)["prompt"] for line in f]


def _wait_until(predicate: Callable[[], bool], timeout_s: float = RESULT_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)


def test_the_engine_satisfies_the_protocol(subject: EngineUnderTest) -> None:
    assert isinstance(subject.engine, Engine)
    assert subject.engine.alive  # type: ignore[attr-defined]


def test_a_request_completes_with_counts_timestamps_and_listener_hooks(
    subject: EngineUnderTest,
) -> None:
    first_step = len(subject.listener.steps)
    request = subject.request("contract-single", "Write a haiku about queues.", 24)
    result = subject.engine.submit(request).result(RESULT_TIMEOUT_S)
    assert result.request_id == "contract-single"
    assert result.num_prompt_tokens > 0 and 1 <= result.num_output_tokens <= 24
    assert result.finish_reason in ("stop", "length")
    assert result.first_token_at is not None
    assert result.admitted_at <= result.first_token_at <= result.finished_at
    listener = subject.listener
    assert listener.first_tokens["contract-single"] == result.first_token_at
    assert "".join(listener.deltas.get("contract-single", [])) == result.output_text
    # NOTE: on_step of a step comes after the results it finished: wait for it.
    _wait_until(lambda: len(listener.steps) > first_step)
    assert all(s.num_seqs >= 1 and s.duration_ms > 0 and 0.0 <= s.kv_cache_usage <= 1.0
               for s in listener.steps[first_step:])


def test_max_tokens_caps_the_output(subject: EngineUnderTest) -> None:
    futures = [subject.engine.submit(subject.request(f"contract-max-{i}", text, 8))
               for i, text in enumerate(_sample_prompts()[:6])]
    results = [f.result(RESULT_TIMEOUT_S) for f in futures]
    for result in results:
        assert result.num_output_tokens <= 8
        if result.finish_reason == "length":
            assert result.num_output_tokens == 8
        else:
            assert result.finish_reason == "stop"  # the random model may sample EOS
    assert any(r.finish_reason == "length" for r in results)


def test_concurrent_submits_share_steps(subject: EngineUnderTest) -> None:
    num_threads = 24
    prompts = _sample_prompts()[:num_threads]
    barrier = threading.Barrier(num_threads)
    results: dict[int, GenerationResult] = {}
    errors: list[BaseException] = []
    first_step = len(subject.listener.steps)

    def client(i: int) -> None:
        try:
            barrier.wait()
            request = subject.request(f"contract-conc-{i}", prompts[i], 32, priority=i % 2)
            results[i] = subject.engine.submit(request).result(RESULT_TIMEOUT_S)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(num_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RESULT_TIMEOUT_S)
    assert not errors and len(results) == num_threads
    assert all(r.num_output_tokens >= 1 for r in results.values())
    steps = subject.listener.steps[first_step:]
    assert max(s.num_seqs for s in steps) > 1
    # Every prompt was prefilled (a last chunk of one token counts as a decode).
    assert sum(s.num_prefill_tokens for s in steps) >= sum(
        r.num_prompt_tokens - 1 for r in results.values())


def test_a_redelivered_id_gets_the_same_future(subject: EngineUnderTest) -> None:
    request = subject.request("contract-dup", "Say it once.", 16)
    first = subject.engine.submit(request)
    assert subject.engine.submit(request) is first
    result = first.result(RESULT_TIMEOUT_S)
    # A redelivery after completion gets the finished result, not a second generation.
    assert subject.engine.submit(request) is first
    assert "".join(subject.listener.deltas.get("contract-dup", [])) == result.output_text


def test_abort_resolves_the_future_with_abort_and_the_engine_goes_on(
    subject: EngineUnderTest,
) -> None:
    engine = subject.engine
    request = subject.request("contract-abort", "Go on forever.", 1900, temperature=0.0)
    future: Future[GenerationResult] = engine.submit(request)
    _wait_until(lambda: "contract-abort" in subject.listener.first_tokens)
    engine.abort("contract-abort")
    result = future.result(RESULT_TIMEOUT_S)
    assert result.finish_reason == "abort" and 1 <= result.num_output_tokens < 1900
    assert all(r.request_id != "contract-abort" for r in engine.snapshot().requests)
    engine.abort("contract-no-such-request")  # unknown ids are ignored
    # An aborted id is not remembered: re-routed back here, it runs again.
    again = engine.submit(subject.request("contract-abort", "hi", 4))
    assert again is not future
    assert again.result(RESULT_TIMEOUT_S).finish_reason in ("stop", "length")


def test_the_snapshot_shows_the_config_and_the_requests_in_flight(
    subject: EngineUnderTest,
) -> None:
    engine = subject.engine
    idle = engine.snapshot()
    assert idle.engine_kind == subject.kind and idle.model
    assert idle.num_total_blocks > 0 and 0 <= idle.num_free_blocks <= idle.num_total_blocks
    assert (idle.block_size, idle.max_num_seqs, idle.max_num_batched_tokens,
            idle.max_model_len) == subject.limits

    request = subject.request(
        "contract-snap", "Describe the sea. " * 20, 1500,
        temperature=0.0,  # greedy: deterministic, so no early EOS by chance
        predicted_output_tokens=300,
    )
    future = engine.submit(request)
    _wait_until(lambda: any(r.request_id == "contract-snap" and r.num_output_tokens > 4
                            for r in engine.snapshot().requests))
    busy = engine.snapshot()
    (state,) = [r for r in busy.requests if r.request_id == "contract-snap"]
    assert state.is_running and state.predicted_output_tokens == 300
    assert state.num_prompt_tokens > 20
    assert state.num_computed_tokens >= state.num_prompt_tokens
    assert busy.num_running >= 1 and busy.num_free_blocks < busy.num_total_blocks
    assert busy.taken_at >= idle.taken_at

    engine.abort("contract-snap")
    future.result(RESULT_TIMEOUT_S)
    _wait_until(lambda: engine.snapshot().num_running == 0)
    assert not engine.snapshot().requests


def test_a_bad_request_fails_alone(subject: EngineUnderTest) -> None:
    engine = subject.engine
    too_long = GenerationRequest("contract-too-long", "word " * 5000, max_tokens=4)
    with pytest.raises(RequestRejected):
        engine.submit(too_long).result(RESULT_TIMEOUT_S)
    with pytest.raises(ValueError):
        engine.submit(subject.request("contract-zero", "hi", 0))
    ok = engine.submit(subject.request("contract-fine", "hi", 4))
    assert ok.result(RESULT_TIMEOUT_S).num_output_tokens >= 1


@pytest.mark.stops_vllm
def test_stop_fails_pending_requests_and_refuses_new_ones(subject: EngineUnderTest) -> None:
    """A second, short-lived engine of the kind (the shared one stays up)."""
    engine = subject.make()
    with pytest.raises(EngineStopped):
        engine.submit(subject.request("contract-early", "hi", 4))  # not started
    assert not engine.alive  # type: ignore[attr-defined]
    engine.start()
    try:
        pending = engine.submit(
            subject.request("contract-pending", "Ramble.", 1900, temperature=0.0))
    finally:
        engine.stop()
    with pytest.raises(EngineStopped):
        pending.result(RESULT_TIMEOUT_S)
    assert not engine.alive  # type: ignore[attr-defined]
    with pytest.raises(EngineStopped):
        engine.submit(subject.request("contract-late", "hi", 4))
    assert subject.engine.alive  # type: ignore[attr-defined]
