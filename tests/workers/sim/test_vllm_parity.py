"""The scheduler model against vLLM's own v1 `Scheduler`, step by step.

vLLM's scheduler runs here without a model: each step's "model output" is one
sampled token for every request whose tokens are all computed, which is what the
engine returns. Random workloads (block sizes, budgets, tight caches that force
preemptions, watermark, prefix caching on and off) must schedule the same tokens
for the same requests in the same order, and preempt the same requests.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from workers.sim import InstanceConfig, Scheduler, SeqState

pytestmark = pytest.mark.vllm

#: A model config vLLM can read; no weights are needed to schedule.
TINY_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
    "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4,
    "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
}
SAMPLED_TOKEN = 7


@pytest.fixture(scope="module")
def vllm() -> SimpleNamespace:
    """vLLM's scheduler pieces, imported only when these tests run (it takes seconds)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("vllm")
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    init_none_hash(sha256)
    return SimpleNamespace(
        torch=torch, CacheConfig=CacheConfig, ModelConfig=ModelConfig,
        SchedulerConfig=SchedulerConfig, VllmConfig=VllmConfig, SamplingParams=SamplingParams,
        sha256=sha256, get_request_block_hasher=get_request_block_hasher,
        VllmScheduler=VllmScheduler, FullAttentionSpec=FullAttentionSpec,
        KVCacheConfig=KVCacheConfig, KVCacheGroupSpec=KVCacheGroupSpec,
        ModelRunnerOutput=ModelRunnerOutput, Request=Request,
        StructuredOutputManager=StructuredOutputManager)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama-config")
    (path / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG))
    return path


def vllm_scheduler(vllm: SimpleNamespace, model_dir: Path, config: InstanceConfig):
    model = vllm.ModelConfig(model=str(model_dir), skip_tokenizer_init=True,
                             max_model_len=config.max_model_len, dtype="float32")
    scheduler = vllm.SchedulerConfig(
        max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=config.max_model_len, enable_chunked_prefill=True,
        is_encoder_decoder=False, watermark=config.watermark)
    cache = vllm.CacheConfig(block_size=config.block_size,
                             enable_prefix_caching=config.enable_prefix_caching)
    cache.num_gpu_blocks = config.num_total_blocks
    vllm_config = vllm.VllmConfig(model_config=model, scheduler_config=scheduler,
                                  cache_config=cache)
    spec = vllm.FullAttentionSpec(block_size=config.block_size, num_kv_heads=1, head_size=1,
                                  dtype=vllm.torch.float32)
    kv_cache = vllm.KVCacheConfig(num_blocks=config.num_total_blocks, kv_cache_tensors=[],
                                  kv_cache_groups=[vllm.KVCacheGroupSpec(["layer.0"], spec)])
    return vllm.VllmScheduler(vllm_config=vllm_config, kv_cache_config=kv_cache,
                              structured_output_manager=vllm.StructuredOutputManager(vllm_config),
                              block_size=config.block_size)


def vllm_request(vllm: SimpleNamespace, request_id: str, prompt: list[int], max_tokens: int,
                 block_size: int):
    params = vllm.SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return vllm.Request(request_id, prompt, params, None,
                        block_hasher=vllm.get_request_block_hasher(block_size, vllm.sha256))


def vllm_step(vllm: SimpleNamespace, scheduler):
    output = scheduler.schedule()
    request_ids = list(output.num_scheduled_tokens)
    sampled = [[SAMPLED_TOKEN] if scheduler.requests[r].num_computed_tokens
               >= scheduler.requests[r].num_tokens else [] for r in request_ids]
    scheduler.update_from_output(output, vllm.ModelRunnerOutput(
        req_ids=request_ids, req_id_to_index={r: i for i, r in enumerate(request_ids)},
        sampled_token_ids=sampled))
    return output


def random_config(rng: random.Random) -> InstanceConfig:
    block_size = rng.choice([1, 4, 16])
    max_model_len = rng.choice([64, 128, 512])
    max_num_seqs = rng.randint(1, 6)
    return InstanceConfig(
        num_total_blocks=rng.randint(max_model_len // block_size + 1,
                                     3 * max_model_len // block_size),
        block_size=block_size, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=rng.randint(max(8, max_num_seqs), 64),
        max_model_len=max_model_len, watermark=rng.choice([0.0, 0.0, 0.05, 0.2]),
        enable_prefix_caching=rng.random() < 0.5)


@pytest.mark.parametrize("seed", range(40))
def test_schedule_matches_vllm_step_by_step(seed: int, vllm: SimpleNamespace,
                                            model_dir: Path) -> None:
    rng = random.Random(seed)
    config = random_config(rng)
    reference, model = vllm_scheduler(vllm, model_dir, config), Scheduler(config)
    arrivals: dict[int, list[tuple[str, int, int]]] = {}
    for i in range(10):
        prompt = rng.randint(1, config.max_model_len - 1)
        output = rng.randint(1, config.max_model_len - prompt)
        arrivals.setdefault(rng.randint(0, 40), []).append((f"q{i}", prompt, output))
    for step in range(20_000):
        for request_id, prompt, output in arrivals.get(step, []):
            tokens = [rng.randint(3, 999) for _ in range(prompt)]
            reference.add_request(vllm_request(vllm, request_id, tokens, output,
                                               config.block_size))
            model.add_request(SeqState(request_id, prompt, output))
        if step > max(arrivals) and not model.has_unfinished_requests:
            assert reference.get_num_unfinished_requests() == 0
            return
        expected = vllm_step(vllm, reference)
        got = model.step().output
        assert list(got.num_scheduled_tokens.items()) == list(
            expected.num_scheduled_tokens.items()), f"step {step}"
        assert set(got.preempted_ids) == set(expected.preempted_req_ids), f"step {step}"
    raise AssertionError("workload did not finish")
