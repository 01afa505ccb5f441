"""What an execution-time model runs on: GPU, model shape, and the vLLM settings that follow.

Each bundled execution-time model (``workers/sim/models/<name>.json``) prices the steps of one
model on one GPU; `DEPLOYMENTS` names, for each, the GPU and the model, and from them the KV
blocks vLLM would find on that GPU and the batch size the fleet runs it with. `instance_config`
turns a name into the simulator's `InstanceConfig`, so that a fleet of unlike instances
(`workers.sim.fleet_declaration`) is declared by execution-time model names alone.

KV blocks, as vLLM sizes them: ``gpu_memory_utilization`` (0.9) of the GPU's memory, less the
weights (2 bytes a parameter) and the activations of a profiling step, divided by the bytes of
one block (``2 (K and V) x layers x KV heads x head size x 2 bytes x block size``). The
activation reserve, 850 MiB, is the one that gives the Block paper's 1,052 blocks for
Llama-2-7B on an A30 (see `num_gpu_blocks`; `DEPLOYMENTS` lists every figure).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .snapshot import InstanceConfig

__all__ = [
    "DEPLOYMENTS",
    "Deployment",
    "GPU",
    "GPUS",
    "ModelShape",
    "MODEL_SHAPES",
    "deployment",
    "instance_config",
    "num_gpu_blocks",
]

#: vLLM's default share of GPU memory it takes.
GPU_MEMORY_UTILIZATION = 0.9
#: MiB a profiling step's activations (and CUDA graphs, the sampler) take off the KV cache: the
#: figure that reproduces 1,052 Llama-2-7B blocks on an A30 (`num_gpu_blocks`).
ACTIVATION_RESERVE_MIB = 850
#: The Block paper's (and the cluster benchmark's) vLLM settings, kept on every GPU.
BLOCK_SIZE = 16
MAX_NUM_BATCHED_TOKENS = 512
MAX_MODEL_LEN = 4096
_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class GPU:
    """One GPU's datasheet figures (SXM parts where there are several)."""

    name: str
    memory_mib: int
    #: HBM bandwidth, GB/s.
    bandwidth_gb_s: float
    #: Dense BF16 tensor throughput, TFLOPS.
    bf16_tflops: float


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What sizes a model's weights and KV cache."""

    name: str
    num_params: float
    num_layers: int
    num_kv_heads: int
    head_size: int

    @property
    def weight_mib(self) -> float:
        return self.num_params * 2 / _MIB  # BF16

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_size * 2


GPUS = {g.name: g for g in (
    GPU("a30", 24 * 1024, 933.0, 165.0),
    GPU("a100", 80 * 1024, 2039.0, 312.0),
    GPU("h100", 80 * 1024, 3350.0, 989.0),
)}
MODEL_SHAPES = {m.name: m for m in (
    ModelShape("llama-2-7b", 6.738e9, 32, 32, 128),
    ModelShape("llama-3-8b", 8.030e9, 32, 8, 128),
    ModelShape("qwen2-7b", 7.616e9, 28, 4, 128),
)}


def num_gpu_blocks(model: ModelShape, gpu: GPU, block_size: int = BLOCK_SIZE) -> int:
    """KV blocks vLLM finds for `model` on `gpu` (module docstring).

    Llama-2-7B: a block is 2 x 32 x 32 x 128 x 2 B x 16 = 8 MiB and the weights 12,852 MiB;
    on an A30 (24,576 MiB) 0.9 x 24,576 - 12,852 - 850 = 8,416 MiB hold 1,052 blocks, on an
    A100 or H100 (81,920 MiB) 60,026 MiB hold 7,503. Llama-3-8B (8 KV heads): 2 MiB blocks,
    15,317 MiB of weights, 28,780 blocks on an A100.
    """
    free_mib = (GPU_MEMORY_UTILIZATION * gpu.memory_mib - model.weight_mib
                - ACTIVATION_RESERVE_MIB)
    block_mib = model.kv_bytes_per_token * block_size / _MIB
    return int(free_mib // block_mib)


@dataclass(frozen=True, slots=True)
class Deployment:
    """A bundled execution-time model's GPU, model and batch size."""

    exec_model: str
    model: ModelShape
    gpu: GPU
    #: vLLM ``max_num_seqs``: the Block paper's 48 on a 24 GB A30; 128 on an 80 GB GPU, whose
    #: KV cache holds that many ShareGPT sequences (mean ~600 tokens) many times over and
    #: whose decode step stays memory-bound at that size.
    max_num_seqs: int

    @property
    def num_gpu_blocks(self) -> int:
        return num_gpu_blocks(self.model, self.gpu)


DEPLOYMENTS = {d.exec_model: d for d in (
    Deployment("llama-2-7b-a30", MODEL_SHAPES["llama-2-7b"], GPUS["a30"], 48),
    Deployment("llama-2-7b-a100", MODEL_SHAPES["llama-2-7b"], GPUS["a100"], 128),
    Deployment("llama-2-7b-h100", MODEL_SHAPES["llama-2-7b"], GPUS["h100"], 128),
    Deployment("llama-3-8b-a100", MODEL_SHAPES["llama-3-8b"], GPUS["a100"], 128),
    Deployment("qwen2-7b-a30", MODEL_SHAPES["qwen2-7b"], GPUS["a30"], 48),
)}
#: The Block paper's vLLM block counts, where they differ from the arithmetic above (Qwen2-7B's
#: 152k-token vocabulary needs a larger activation reserve than Llama's 32k).
_MEASURED_BLOCKS = {"qwen2-7b-a30": 7289}


def deployment(exec_model: str) -> Deployment:
    try:
        return DEPLOYMENTS[exec_model]
    except KeyError:
        raise ValueError(f"no deployment for execution-time model {exec_model!r}; known: "
                         f"{sorted(DEPLOYMENTS)}") from None


def instance_config(exec_model: str, **overrides: object) -> InstanceConfig:
    """The vLLM settings of one instance running `exec_model`'s model on its GPU: its KV blocks
    and batch size, and the Block paper's block size, token budget and context; `overrides`
    replace any field. A model with no deployment (a model file's, a derived kind's) needs its
    KV blocks and batch size among the overrides: nothing else knows its GPU."""
    if exec_model not in DEPLOYMENTS and {"num_total_blocks", "max_num_seqs"} <= set(overrides):
        blocks, seqs = overrides["num_total_blocks"], overrides["max_num_seqs"]
    else:
        spec = deployment(exec_model)
        blocks = _MEASURED_BLOCKS.get(exec_model, spec.num_gpu_blocks)
        seqs = spec.max_num_seqs
    config = InstanceConfig(
        num_total_blocks=blocks, block_size=BLOCK_SIZE, max_num_seqs=seqs,  # type: ignore[arg-type]
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, max_model_len=MAX_MODEL_LEN)
    return replace(config, **overrides) if overrides else config
