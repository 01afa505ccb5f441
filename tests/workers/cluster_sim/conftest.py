"""Shared inputs of the cluster simulation tests: a small instance config, a toy step-time model."""

from __future__ import annotations

import pytest

from workers.sim import ExecModel, InstanceConfig

#: 10 ms per step plus a little per token: simple enough to reason about, every feature used.
TOY_COEFFICIENTS = {"const": 10.0, "num_tokens": 0.01, "num_decode_seqs": 0.05,
                    "num_prefill_seqs": 0.2, "decode_context_tokens": 0.0001}


@pytest.fixture
def toy_model() -> ExecModel:
    return ExecModel("toy", (), TOY_COEFFICIENTS)


@pytest.fixture
def small_config() -> InstanceConfig:
    return InstanceConfig(num_total_blocks=65, block_size=16, max_num_seqs=8,
                          max_num_batched_tokens=128, max_model_len=512)
