"""The bundled execution-time models of unlike GPUs and the vLLM settings each runs with."""

from __future__ import annotations

import pytest

from workers.sim import BatchStats, bundled_model, bundled_model_names
from workers.sim.hardware import (
    DEPLOYMENTS,
    GPUS,
    MODEL_SHAPES,
    deployment,
    instance_config,
    num_gpu_blocks,
)

#: The names the fleet setting and the cluster benchmark use.
FLEET_MODELS = ("llama-2-7b-a30", "llama-2-7b-a100", "llama-2-7b-h100", "llama-3-8b-a100")
#: Steps of several shapes: one decode, a full decode batch, a prefill chunk, a mixed step.
STEPS = (BatchStats(num_decode_seqs=1, decode_context_tokens=500),
         BatchStats(num_decode_seqs=48, decode_context_tokens=48 * 600),
         BatchStats(512, 0, 1, 0, 0, 512 * 512),
         BatchStats(400, 48, 1, 48 * 600, 400 * 1000, 400 * 400))


@pytest.mark.parametrize("name", FLEET_MODELS)
def test_every_fleet_model_loads_by_name_with_its_deployment(name: str) -> None:
    assert name in bundled_model_names()
    model = bundled_model(name)
    assert model.name == name
    config = instance_config(name)
    assert config.num_total_blocks == deployment(name).num_gpu_blocks
    assert all(model.step_ms(stats) > 0 for stats in STEPS)


@pytest.mark.parametrize("stats", STEPS)
def test_faster_gpus_take_shorter_steps(stats: BatchStats) -> None:
    h100, a100, a30 = (bundled_model(f"llama-2-7b-{gpu}").step_ms(stats)
                       for gpu in ("h100", "a100", "a30"))
    assert h100 < a100 < a30
    # Neither more than the datasheets allow nor implausibly little (x1.5 to x8).
    assert 1.5 < a30 / a100 < 3.0 and 2.0 < a30 / h100 < 8.0


def test_kv_blocks_follow_memory_weights_and_kv_heads() -> None:
    llama2, llama3 = MODEL_SHAPES["llama-2-7b"], MODEL_SHAPES["llama-3-8b"]
    # The Block paper's vLLM count on an A30 is the calibration point.
    assert num_gpu_blocks(llama2, GPUS["a30"]) == 1052
    assert num_gpu_blocks(llama2, GPUS["a100"]) == num_gpu_blocks(llama2, GPUS["h100"]) == 7503
    # A quarter of Llama-2's KV heads: about four times the blocks, less for larger weights.
    assert num_gpu_blocks(llama3, GPUS["a100"]) == 28780
    for spec in DEPLOYMENTS.values():
        assert instance_config(spec.exec_model).max_num_seqs == spec.max_num_seqs


def test_an_unknown_model_is_named_in_the_error() -> None:
    with pytest.raises(ValueError, match="llama-2-7b-v100.*known"):
        instance_config("llama-2-7b-v100")
    assert instance_config("llama-2-7b-a30", max_num_seqs=24).max_num_seqs == 24
