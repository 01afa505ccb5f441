"""A GPU kind from its datasheet: step times and vLLM settings for a kind nobody profiled.

A profiled kind's execution-time model (`workers.sim.ExecModel`, milliseconds per step, linear in
the batch's features) is scaled by datasheet ratios, part by part:

- memory-bound parts scale with memory bandwidth (``bw_base / bw_kind``): the step's floor (the
  weights read once a step: the constant and the first token), each decode's own cost and the
  KV cache a decode reads (``decode_context_tokens``);
- compute-bound parts scale with dense BF16 throughput (``tflops_base / tflops_kind``): every
  token past the first (the token term's slopes: GEMMs over the batch), each prefill's own cost
  and prefill attention (``prefill_chunk_x_context``, ``prefill_chunk_sq``).

The time ratios measured between A30, A100 and H100 were within 4-7 % of the datasheet ratios;
`derivation_error` checks the result against the profiled models on a grid of batch shapes
(docs/planning.md). A kind's KV blocks follow from its memory (`workers.sim.hardware`), and its
batch size is the Block paper's 48 on a GPU under 40 GiB, 128 above (`hardware.DEPLOYMENTS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from workers.sim import BatchStats, ExecModel, InstanceConfig, bundled_model, bundled_model_names
from workers.sim.exec_model import feature_names
from workers.sim.hardware import (
    BLOCK_SIZE,
    DEPLOYMENTS,
    GPU,
    GPUS,
    MAX_MODEL_LEN,
    MAX_NUM_BATCHED_TOKENS,
    MODEL_SHAPES,
    instance_config,
    num_gpu_blocks,
)

from .catalog import GpuKind
from .workload import PlanInputError

__all__ = ["KindModel", "VALIDATION_GRID", "derivation_error", "derive_exec_model", "families",
           "kind_model", "max_num_seqs_for"]

#: Profiled GPUs a family's derivations start from, in order of preference (the A30: the kind
#: whose derivations `derivation_error` validates).
BASE_PREFERENCE = ("a30", "a100", "h100")
#: GPUs with less memory than this run the Block paper's batch of 48; larger ones 128.
LARGE_GPU_GIB = 40
#: Feature names scaled with bandwidth (the rest of the non-token features: with FLOPS).
_MEMORY_BOUND = frozenset({"num_decode_seqs", "decode_context_tokens"})


@dataclass(frozen=True, slots=True)
class KindModel:
    """One model family on one GPU kind: what the simulation runs an instance with."""

    family: str
    kind: str
    #: The execution-time model's name: a bundled one, or ``<family>-<kind>`` when derived.
    exec_model_name: str
    exec_model: ExecModel
    config: InstanceConfig
    #: Whether the step times were derived from a datasheet (not profiled on this kind).
    derived: bool


def families() -> list[str]:
    """Model families with at least one bundled execution-time model and a known shape."""
    return sorted(f for f in MODEL_SHAPES if _profiled_gpus(f))


def _profiled_gpus(family: str) -> list[str]:
    names = set(bundled_model_names())
    return [g for g in BASE_PREFERENCE if f"{family}-{g}" in names]


def derive_exec_model(base: ExecModel, base_gpu: GPU, gpu: GPU, name: str) -> ExecModel:
    """`base` (profiled on `base_gpu`) scaled to `gpu` by datasheet ratios (module docstring)."""
    memory = base_gpu.bandwidth_gb_s / gpu.bandwidth_gb_s
    compute = base_gpu.bf16_tflops / gpu.bf16_tflops
    coef = dict(zip(feature_names(base.token_knots),
                    (float(base.coefficients_ms.get(n, 0.0))
                     for n in feature_names(base.token_knots)), strict=True))
    slope = coef["num_tokens"]
    scaled = {}
    for feature, value in coef.items():
        if feature == "const":
            # The first token's share of the slope moves to the memory-bound floor.
            scaled[feature] = memory * value + (memory - compute) * slope
        elif feature in _MEMORY_BOUND:
            scaled[feature] = memory * value
        else:
            scaled[feature] = compute * value
    return ExecModel(name=name, token_knots=base.token_knots, coefficients_ms=scaled,
                     source=f"derived from {base.name} by datasheet ratios: bandwidth "
                            f"{base_gpu.bandwidth_gb_s:g}->{gpu.bandwidth_gb_s:g} GB/s, BF16 "
                            f"{base_gpu.bf16_tflops:g}->{gpu.bf16_tflops:g} TFLOPS")


def max_num_seqs_for(memory_gib: float) -> int:
    return 48 if memory_gib < LARGE_GPU_GIB else 128


def kind_model(family: str, kind: GpuKind) -> KindModel:
    """`family` on `kind`: the bundled model where the kind is profiled for it, else derived
    from the family's preferred profiled GPU. Raises `PlanInputError` naming the family or the
    kind when it cannot run (no profile, or the weights do not fit)."""
    profiled = _profiled_gpus(family)
    if family not in MODEL_SHAPES or not profiled:
        raise PlanInputError(f"model {family!r} has no execution-time model; known families: "
                             f"{families()} (map a served name with --model-map SERVED=FAMILY)")
    own = f"{family}-{kind.profiled_as}" if kind.profiled_as else None
    if own is not None and own in DEPLOYMENTS:
        return KindModel(family, kind.name, own, bundled_model(own), instance_config(own), False)
    blocks = num_gpu_blocks(MODEL_SHAPES[family], kind.gpu)
    if blocks * BLOCK_SIZE < MAX_MODEL_LEN:
        raise PlanInputError(f"GPU kind {kind.name!r}: {kind.memory_gib:g} GiB cannot hold "
                             f"{family} and one {MAX_MODEL_LEN}-token sequence")
    base_gpu = GPUS[profiled[0]]
    name = f"{family}-{kind.name.lower()}"
    model = derive_exec_model(bundled_model(f"{family}-{profiled[0]}"), base_gpu, kind.gpu, name)
    config = InstanceConfig(num_total_blocks=blocks, block_size=BLOCK_SIZE,
                            max_num_seqs=max_num_seqs_for(kind.memory_gib),
                            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                            max_model_len=MAX_MODEL_LEN)
    return KindModel(family, kind.name, name, model, config, True)


def _grid() -> tuple[BatchStats, ...]:
    """Batch shapes of a serving engine: decode batches at several sizes and contexts, prefill
    chunks with and without cached context, and mixed steps (a chunk beside decodes)."""
    shapes = []
    for seqs in (1, 4, 16, 48, 128):
        for context in (128, 512, 2048):
            shapes.append(BatchStats(num_decode_seqs=seqs, decode_context_tokens=seqs * context))
    for chunk in (32, 128, 256, 512):
        for cached in (0, 1024):
            shapes.append(BatchStats(num_prefill_tokens=chunk, num_prefill_seqs=1,
                                     prefill_chunk_x_context=chunk * cached,
                                     prefill_chunk_sq=chunk * chunk))
    for seqs in (8, 32):
        chunk = MAX_NUM_BATCHED_TOKENS - seqs
        shapes.append(BatchStats(num_prefill_tokens=chunk, num_decode_seqs=seqs,
                                 num_prefill_seqs=1, decode_context_tokens=seqs * 600,
                                 prefill_chunk_sq=chunk * chunk))
    return tuple(shapes)


#: The shapes `derivation_error` compares step times on.
VALIDATION_GRID = _grid()


def derivation_error(family: str, base_gpu: str, target_gpu: str,
                     grid: Sequence[BatchStats] = VALIDATION_GRID) -> dict[str, float]:
    """Median and maximum relative step-time error of `family` derived from `base_gpu` to
    `target_gpu` against the model profiled on `target_gpu`, over `grid`."""
    base = bundled_model(f"{family}-{base_gpu}")
    profiled = bundled_model(f"{family}-{target_gpu}")
    derived = derive_exec_model(base, GPUS[base_gpu], GPUS[target_gpu],
                                f"{family}-{target_gpu}-derived")
    errors = np.array([abs(derived.step_ms(s) - profiled.step_ms(s)) / profiled.step_ms(s)
                       for s in grid])
    return {"median": float(np.median(errors)), "max": float(errors.max()),
            "num_shapes": float(len(errors))}

