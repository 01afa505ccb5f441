"""Instance configurations for the ground-truth tests."""

from __future__ import annotations

import random

from workers.sim import InstanceConfig


def random_config(rng: random.Random) -> InstanceConfig:
    """A small instance that runs out of blocks often: preemptions, chunked prefills."""
    block_size = rng.choice([1, 4, 16])
    max_model_len = rng.choice([64, 128, 256])
    min_blocks = -(-max_model_len // block_size) + 1
    return InstanceConfig(rng.randint(min_blocks, 3 * min_blocks), block_size,
                          rng.randint(1, 8), rng.randint(8, 64), max_model_len,
                          watermark=rng.choice([0.0, 0.05]),
                          reserve_full_input=rng.random() < 0.8)
