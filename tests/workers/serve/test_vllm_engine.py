"""VllmEngine beyond the Engine contract (test_engine_contract.py): its config, its prompt
counts, the sample prompts it is exercised with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers.serve.engine import GenerationRequest
from workers.serve.vllm_engine import VllmEngineConfig

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
