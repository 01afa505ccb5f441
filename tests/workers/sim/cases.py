"""Test inputs for the simulator tests: a toy execution-time model, random snapshots."""

from __future__ import annotations

import random

from workers.sim import InstanceConfig, InstanceSnapshot, SimRequest

#: Coefficients (ms) of the toy model; every feature matters so mistakes show up.
TOY_COEFFICIENTS = {
    "const": 5.0, "num_tokens": 0.05, "num_tokens_over_64": 0.02, "num_decode_seqs": 0.1,
    "num_prefill_seqs": 0.3, "decode_context_tokens": 0.001,
    "prefill_chunk_x_context": 1e-5, "prefill_chunk_sq": 2e-5,
}


def random_case(rng: random.Random, *, max_running: int = 8,
                max_waiting: int = 6) -> tuple[InstanceSnapshot, SimRequest]:
    """A consistent random snapshot (tight blocks, small budgets) and a new request."""
    block_size = rng.choice([1, 2, 4, 16])
    max_model_len = rng.choice([64, 128, 512])
    min_blocks = -(-max_model_len // block_size) + 1  # vLLM keeps one block back
    total = rng.randint(min_blocks, 4 * min_blocks)
    max_num_seqs = rng.randint(1, max_running)
    config = InstanceConfig(total, block_size, max_num_seqs, rng.randint(max_num_seqs, 64),
                            max_model_len, watermark=rng.choice([0.0, 0.0, 0.05]),
                            enable_prefix_caching=rng.random() < 0.5,
                            reserve_full_input=rng.random() < 0.8)
    requests, held = [], 0
    for i in range(rng.randint(0, max_num_seqs)):
        prompt = rng.randint(1, max_model_len // 2)
        generated = rng.randint(0, max_model_len // 4) if rng.random() < 0.7 else 0
        generated = 0 if prompt + generated >= max_model_len else generated
        computed = prompt + generated - 1 if generated else rng.randint(0, prompt - 1)
        if held + -(-computed // block_size) > config.num_usable_blocks:
            break
        held += -(-computed // block_size)
        predicted = rng.choice([None, rng.randint(1, max_model_len)])
        cached = rng.choice([0, 0, rng.randint(0, prompt)])
        requests.append(SimRequest(f"r{i}", prompt, computed, generated, predicted, True, cached))
    for i in range(rng.randint(0, max_waiting)):
        prompt = rng.randint(1, max_model_len - 1)
        generated = rng.randint(0, 5) if rng.random() < 0.2 else 0
        generated = 0 if prompt + generated >= max_model_len else generated
        requests.append(SimRequest(f"w{i}", prompt, 0, generated, rng.randint(1, max_model_len),
                                   False, rng.choice([0, rng.randint(0, prompt)])))
    new = SimRequest("new", rng.randint(1, max_model_len - 1),
                     predicted_output_tokens=rng.randint(1, max_model_len),
                     num_cached_tokens=rng.choice([0, 20]))
    return InstanceSnapshot(config, config.num_usable_blocks - held, tuple(requests)), new
