"""vLLM with prefix caching on: the engine records what vLLM's cache served each request
(num_cached_tokens) and publishes the prompt units it holds, hashed as the route stage hashes a
new request's prompt. Runs the tiny model on CPU (marked vllm)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.workers.serve.recording import RecordingListener
from workers.serve.engine import GenerationRequest, SamplingOptions
from workers.serve.prefixes import PrefixMemory
from workers.sim.engine_state import EngineState
from workers.sim.snapshot import live_prefix_unit_tokens

RESULT_TIMEOUT_S = 120
BLOCK_SIZE = 32  # vLLM's CPU attention needs a multiple of 32
UNIT = live_prefix_unit_tokens(BLOCK_SIZE)


@pytest.fixture(scope="module")
def caching_engine(tiny_model_dir: Path) -> Iterator:
    pytest.importorskip("vllm")
    from workers.serve.vllm_engine import VllmEngine, VllmEngineConfig

    engine = VllmEngine(VllmEngineConfig(
        model=str(tiny_model_dir), block_size=BLOCK_SIZE, kv_cache_gib=0.25, max_num_seqs=8,
        max_num_batched_tokens=512, max_model_len=2048, enable_prefix_caching=True),
        RecordingListener())
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
