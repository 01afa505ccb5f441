"""Fit the execution-time models shipped in ``workers/sim/models`` from Vidur profiling CSVs.

Reads the profiles under ``<data>/profiling`` (see ``SOURCES.md`` in the data directory) and
writes one JSON model per entry of `MODELS`, then prints their fit metrics.

* ``qwen2-7b-a30``: Qwen2-7B mlp.csv + attention.csv on an A30, the complete set.
* ``llama-2-7b-a30``: Llama-2-7B mlp.csv on an A30; its attention.csv was not copied (13.8 MB),
  so attention comes from the Qwen2-7B A30 profile (same head size, 128), scaled by the
  KV-head ratio for decode attention and KV writes (32 / 4) and by the query-head ratio
  for prefill attention (32 / 28). Only its token part is checked against held-out rows.
* ``llama-2-7b-a100`` and ``llama-2-7b-h100``: Vidur's Llama-2-7B mlp.csv on that GPU; attention
  as for ``llama-2-7b-a30`` (no A100 or H100 attention profile here), then moved to the GPU:
  decode attention and KV writes (memory-bound) x the GPU's memory time ratio to the A30, prefill
  attention (compute-bound) x its compute time ratio, both measured on the two Llama-2-7B
  mlp.csv files (`workers.sim.profiling.gpu_time_ratios`: the median time ratio at <= 32 tokens
  and at >= 1,024 tokens).
* ``llama-3-8b-a100``: Vidur's Llama-3-8B mlp.csv on an A100; attention from the Qwen2-7B A30
  profile scaled by Llama-3-8B's heads (8 KV heads: x 8 / 4; 32 query heads: x 32 / 28) and
  moved to the A100 by the Llama-2-7B ratios (a property of the GPUs, not the model).

Usage::

    python scripts/fit_exec_model.py [--data DIR] [--out DIR] [--seed S]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from benchmarks.paths import DATA_DIR
from benchmarks.tables import print_table
from workers.sim.exec_model import MODELS_DIR, ExecModel
from workers.sim.profiling import (
    AttentionScale,
    fit_from_vidur_profile,
    gpu_time_ratios,
    load_token_profile,
)

#: ``../shared/data`` next to the repository checkout.
DEFAULT_DATA_DIR = DATA_DIR
A30_DIR = Path("profiling/vidur_opt_scheduler/compute/a30")
VIDUR_DIR = Path("profiling/vidur/compute")
QWEN_A30_ATTENTION = A30_DIR / "Qwen/Qwen-2-7B/attention.csv"
LLAMA_2_A30_MLP = A30_DIR / "meta-llama/Llama-2-7b-hf/mlp.csv"
#: Head ratios of Llama-2-7B (32 KV, 32 query heads) and Llama-3-8B (8, 32) to Qwen2-7B (4, 28).
LLAMA_2_HEADS = AttentionScale(kv=32 / 4, prefill=32 / 28)
LLAMA_3_HEADS = AttentionScale(kv=8 / 4, prefill=32 / 28)


@dataclass(frozen=True, slots=True)
class ProfiledModel:
    name: str
    mlp_csv: Path
    attention_csv: Path
    num_layers: int
    attention_scale: AttentionScale = AttentionScale()
    #: Moves the attention profile's GPU (A30) to this model's: Llama-2-7B's mlp.csv on the
    #: A30 and on this GPU (`gpu_time_ratios`); None: the same GPU.
    gpu_reference: tuple[Path, Path] | None = None
    note: str = ""


def _on(gpu: str) -> tuple[Path, Path]:
    return LLAMA_2_A30_MLP, VIDUR_DIR / gpu / "meta-llama/Llama-2-7b-hf/mlp.csv"


MODELS = (
    ProfiledModel("qwen2-7b-a30", A30_DIR / "Qwen/Qwen-2-7B/mlp.csv", QWEN_A30_ATTENTION,
                  num_layers=28),
    ProfiledModel("llama-2-7b-a30", LLAMA_2_A30_MLP, QWEN_A30_ATTENTION, num_layers=32,
                  attention_scale=LLAMA_2_HEADS,
                  note="attention borrowed from Qwen2-7B A30, scaled by head ratios "
                       "(KV x8, query x32/28)"),
    ProfiledModel("llama-2-7b-a100", VIDUR_DIR / "a100/meta-llama/Llama-2-7b-hf/mlp.csv",
                  QWEN_A30_ATTENTION, num_layers=32, attention_scale=LLAMA_2_HEADS,
                  gpu_reference=_on("a100"),
                  note="attention borrowed from Qwen2-7B A30, scaled by head ratios "
                       "(KV x8, query x32/28), moved to the A100 by the Llama-2-7B mlp.csv "
                       "time ratios A100/A30"),
    ProfiledModel("llama-2-7b-h100", VIDUR_DIR / "h100/meta-llama/Llama-2-7b-hf/mlp.csv",
                  QWEN_A30_ATTENTION, num_layers=32, attention_scale=LLAMA_2_HEADS,
                  gpu_reference=_on("h100"),
                  note="attention borrowed from Qwen2-7B A30, scaled by head ratios "
                       "(KV x8, query x32/28), moved to the H100 by the Llama-2-7B mlp.csv "
                       "time ratios H100/A30"),
    ProfiledModel("llama-3-8b-a100", VIDUR_DIR / "a100/meta-llama/Meta-Llama-3-8B/mlp.csv",
                  QWEN_A30_ATTENTION, num_layers=32, attention_scale=LLAMA_3_HEADS,
                  gpu_reference=_on("a100"),
                  note="attention borrowed from Qwen2-7B A30, scaled by head ratios "
                       "(KV x2, query x32/28), moved to the A100 by the Llama-2-7B mlp.csv "
                       "time ratios A100/A30"),
)


def fit(spec: ProfiledModel, data_dir: Path, seed: int) -> ExecModel:
    source = (f"Vidur profile {spec.mlp_csv} + {spec.attention_csv}, "
              f"{spec.num_layers} layers, TP 1, seed {seed}")
    scale = spec.attention_scale
    if spec.gpu_reference is not None:
        reference, target = (load_token_profile(data_dir / p) for p in spec.gpu_reference)
        memory, compute = gpu_time_ratios(reference, target)
        scale = AttentionScale(scale.kv, scale.prefill, memory=memory, compute=compute)
        source += f"; GPU time ratios memory {memory:.3f}, compute {compute:.3f}"
    if spec.note:
        source += f"; {spec.note}"
    return fit_from_vidur_profile(data_dir / spec.mlp_csv, data_dir / spec.attention_csv,
                                  num_layers=spec.num_layers, name=spec.name,
                                  attention_scale=scale, seed=seed, source=source)


def print_fits(models: list[ExecModel]) -> None:
    keys = sorted({k for m in models for k in m.metrics if not k.endswith("num_holdout")})
    print_table("Execution-time model fits (held-out profiling rows)",
                ["metric", *(model.name for model in models)],
                [[key, *(f"{m.metrics[key]:.4f}" if key in m.metrics else "-" for m in models)]
                 for key in keys])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR,
                        help="shared data directory (default: ../shared/data)")
    parser.add_argument("--out", type=Path, default=MODELS_DIR,
                        help="where to write the model JSON files")
    parser.add_argument("--seed", type=int, default=0, help="seed of the held-out split")
    args = parser.parse_args()
    models = [fit(spec, args.data, args.seed) for spec in MODELS]
    args.out.mkdir(parents=True, exist_ok=True)
    for model in models:
        model.save(args.out / f"{model.name}.json")
    print_fits(models)
