"""vLLM with prefix caching on: the engine records what vLLM's cache served each request
(num_cached_tokens) and publishes the prompt units it holds, hashed as the route stage hashes a
new request's prompt. Runs the tiny model on CPU (marked vllm)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.workers.serve.recording import RecordingListener
from workers.serve.engine import GenerationRequest, SamplingOptions, StepSample
from workers.serve.prefixes import PrefixMemory
from workers.sim.engine_state import EngineState
from workers.sim.snapshot import live_prefix_unit_tokens

RESULT_TIMEOUT_S = 120
BLOCK_SIZE = 32  # vLLM's CPU attention needs a multiple of 32
UNIT = live_prefix_unit_tokens(BLOCK_SIZE)


class ProgressListener(RecordingListener):
    """Also reads the engine's published progress of one request after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = None
        self.watched: str | None = None
        self.progress: list[tuple[int, int, bool]] = []  # (output, computed, running)

    def on_step(self, sample: StepSample) -> None:
        super().on_step(sample)
        if self.engine is None or self.watched is None:
            return
        for request in self.engine.snapshot().requests:
            if request.request_id == self.watched:
                self.progress.append((request.num_output_tokens, request.num_computed_tokens,
                                      request.is_running))


@pytest.fixture(scope="module")
def listener() -> ProgressListener:
    return ProgressListener()


@pytest.fixture(scope="module")
def caching_engine(tiny_model_dir: Path, listener: ProgressListener) -> Iterator:
    pytest.importorskip("vllm")
    from workers.serve.vllm_engine import VllmEngine, VllmEngineConfig

    engine = VllmEngine(VllmEngineConfig(
        model=str(tiny_model_dir), block_size=BLOCK_SIZE, kv_cache_gib=0.25, max_num_seqs=8,
        max_num_batched_tokens=512, max_model_len=2048, enable_prefix_caching=True),
        listener)
    listener.engine = engine
    engine.start()
    yield engine
    engine.stop()


@pytest.mark.vllm
def test_vllm_reports_cache_hits_and_publishes_its_units(caching_engine) -> None:
    shared = [(11 * i) % 300 + 5 for i in range(320)]  # 10 blocks, 5 units
    first = shared + [7, 8, 9]
    caching_engine.submit(GenerationRequest("pc-1", "", max_tokens=2,
                                            prompt_token_ids=tuple(first))
                          ).result(RESULT_TIMEOUT_S)
    keys = PrefixMemory(UNIT, 10_000).keys_of(first)
    state = EngineState.from_json(caching_engine.snapshot().to_json())
    assert state.prefix_unit_tokens == UNIT
    assert set(keys) <= set(state.cached_prefixes)  # a finished request's units

    second = shared + [20, 21, 22, 23]
    future = caching_engine.submit(GenerationRequest(
        "pc-2", "", max_tokens=400, prompt_token_ids=tuple(second),
        sampling=SamplingOptions(ignore_eos=True)))
    try:
        seen = None
        deadline = time.monotonic() + RESULT_TIMEOUT_S
        while time.monotonic() < deadline and not future.done():
            seen = next((r for r in caching_engine.snapshot().requests
                         if r.request_id == "pc-2" and r.num_output_tokens), None)
            if seen is not None:
                break
            time.sleep(0.01)
        assert seen is not None
        assert seen.num_cached_tokens == 320  # vLLM's full cached blocks of the shared prefix
        assert seen.is_running and seen.num_computed_tokens >= len(second)
    finally:
        caching_engine.abort("pc-2")
    future.result(RESULT_TIMEOUT_S)


@pytest.mark.vllm
def test_a_cached_prefix_counts_as_computed_while_the_rest_is_prefilled(
        caching_engine, listener) -> None:
    """Routers' what-ifs read each request's progress from the published state: a prompt
    whose first 320 tokens vLLM's cache served is 320 + 512 k tokens along after its k-th
    chunk of 512, not 512 k (as a replay that does not know the hit would count it)."""
    shared = [(13 * i) % 300 + 5 for i in range(320)]  # 10 blocks
    caching_engine.submit(GenerationRequest("pc-warm", "", max_tokens=1,
                                            prompt_token_ids=tuple(shared + [1, 2]))
                          ).result(RESULT_TIMEOUT_S)
    long_prompt = tuple(shared + [(7 * i) % 290 + 3 for i in range(1200)])  # 3 more chunks
    listener.watched = "pc-long"
    try:
        caching_engine.submit(GenerationRequest("pc-long", "", max_tokens=2,
                                                prompt_token_ids=long_prompt)
                              ).result(RESULT_TIMEOUT_S)
    finally:
        listener.watched = None
    prefilling = [computed for output, computed, running in listener.progress
                  if running and not output]
    # With vLLM's async scheduling a step's progress may already count the next chunk.
    assert prefilling and set(prefilling) <= {320 + 512, 320 + 1024, len(long_prompt)}
