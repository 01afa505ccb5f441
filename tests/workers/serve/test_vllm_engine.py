"""VllmEngine beyond the Engine contract (test_engine_contract.py): its config, its prompt
counts, the sample prompts it is exercised with."""

from __future__ import annotations

import json
from concurrent.futures import Future
from pathlib import Path

import pytest

from workers.serve.engine import GenerationRequest
from workers.serve.vllm_engine import VllmEngine, VllmEngineConfig
from workers.sim import engine_priority

REPO_ROOT = Path(__file__).resolve().parents[3]
SAMPLE_PROMPTS = REPO_ROOT / "app" / "demo" / "sample_prompts.jsonl"
RESULT_TIMEOUT_S = 60


def test_sample_prompts_file_is_valid():
    with SAMPLE_PROMPTS.open(encoding="utf-8") as f:
        samples = [json.loads(line) for line in f]
    assert len(samples) >= 200
    for sample in samples:
        assert set(sample) == {"prompt", "max_tokens", "source"}
        assert isinstance(sample["prompt"], str) and 0 < len(sample["prompt"]) <= 1500
        assert isinstance(sample["max_tokens"], int) and 16 <= sample["max_tokens"] <= 192
        assert isinstance(sample["source"], str) and sample["source"]
    assert len({s["prompt"] for s in samples}) == len(samples)
    assert len({s["max_tokens"] for s in samples}) > 20  # output lengths vary


def test_config_is_validated():
    with pytest.raises(ValueError):
        VllmEngineConfig(model="m", max_num_seqs=0)
    with pytest.raises(ValueError):
        VllmEngineConfig(model="m", block_size=0)
    with pytest.raises(ValueError):
        VllmEngineConfig(model="m", kv_cache_gib=0)
    with pytest.raises(ValueError, match="scheduling_policy"):
        VllmEngineConfig(model="m", scheduling_policy="sjf")


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_the_priority_vllm_gets_is_the_class_or_predicted_shortest_first(policy: str) -> None:
    # Built, not started (no vLLM needed): what _track hands add_request and the state shows.
    engine = VllmEngine(VllmEngineConfig(model="m", scheduling_policy=policy,
                                         priority_ms_per_token=2.0))
    tracked = {}
    for request_id, predicted, klass in (("long", 500, 0), ("short", 10, 0), ("batch", 1, 1)):
        request = GenerationRequest(request_id, "hi", max_tokens=600,
                                    predicted_output_tokens=predicted, priority=klass)
        tracked[request_id] = engine._track(request, Future(), None)
    long, short, batch = tracked["long"], tracked["short"], tracked["batch"]
    if policy == "fcfs":  # class, then arrival ms
        assert long.priority == engine_priority(0, long.admitted_at, None, 0.0)
        assert long.priority <= short.priority < batch.priority
    else:
        assert long.priority == engine_priority(0, long.admitted_at, 500, 2.0)
        assert short.priority < long.priority < batch.priority
    with engine._cond:
        engine._inflight.update({"long": long, "short": short})
    # Interactive requests only: "fcfs" is plain FCFS.
    assert engine.snapshot().scheduling_policy == policy
    with engine._cond:
        engine._inflight["batch"] = batch
    # A batch request in: vLLM's priority policy on class-first priorities, whichever setting.
    state = engine.snapshot()
    assert state.scheduling_policy == "priority"
    assert state.priority_ms_per_token == (2.0 if policy == "priority" else 0.0)
    assert [r.priority for r in state.requests] == [tracked[r].priority
                                                   for r in ("long", "short", "batch")]


@pytest.mark.vllm
def test_prompt_tokens_are_counted_as_the_models_tokenizer_counts_them(
    vllm_engine, tiny_model_dir
):
    from transformers import AutoTokenizer

    prompt = "<|user|>\nWrite a haiku about queues.\n<|assistant|>\n"
    result = vllm_engine.submit(
        GenerationRequest("vllm-count", prompt, max_tokens=4)
    ).result(RESULT_TIMEOUT_S)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    assert result.num_prompt_tokens == len(tokenizer(prompt)["input_ids"])
