"""Fit the execution-time models shipped in ``workers/sim/models`` from Vidur profiling CSVs.

Reads the A30 profiles under ``<data>/profiling/vidur_opt_scheduler/compute/a30`` (see
``SOURCES.md`` in the data directory) and writes one JSON model per entry of `MODELS`,
then prints their fit metrics.

* ``qwen2-7b-a30``: Qwen2-7B mlp.csv + attention.csv, the complete set.
* ``llama-2-7b-a30``: Llama-2-7B mlp.csv; its attention.csv was not copied (13.8 MB), so
  attention comes from the Qwen2-7B A30 profile (same head size, 128), scaled by the
  KV-head ratio for decode attention and KV writes (32 / 4) and by the query-head ratio
  for prefill attention (32 / 28). Only its token part is checked against held-out rows.

Usage::

    python scripts/fit_exec_model.py [--data DIR] [--out DIR] [--seed S]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from workers.sim.exec_model import MODELS_DIR, ExecModel
from workers.sim.profiling import AttentionScale, fit_from_vidur_profile

REPO_ROOT = Path(__file__).resolve().parent.parent
#: ``../shared/data`` next to the repository checkout.
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data"
A30_DIR = Path("profiling/vidur_opt_scheduler/compute/a30")


@dataclass(frozen=True, slots=True)
class ProfiledModel:
    name: str
    mlp_csv: Path
    attention_csv: Path
    num_layers: int
    attention_scale: AttentionScale = AttentionScale()
    note: str = ""


MODELS = (
    ProfiledModel("qwen2-7b-a30", A30_DIR / "Qwen/Qwen-2-7B/mlp.csv",
                  A30_DIR / "Qwen/Qwen-2-7B/attention.csv", num_layers=28),
    ProfiledModel("llama-2-7b-a30", A30_DIR / "meta-llama/Llama-2-7b-hf/mlp.csv",
                  A30_DIR / "Qwen/Qwen-2-7B/attention.csv", num_layers=32,
                  attention_scale=AttentionScale(kv=32 / 4, prefill=32 / 28),
                  note="attention borrowed from Qwen2-7B A30, scaled by head ratios "
                       "(KV x8, query x32/28)"),
)


def fit(spec: ProfiledModel, data_dir: Path, seed: int) -> ExecModel:
    source = (f"Vidur profile {spec.mlp_csv} + {spec.attention_csv}, "
              f"{spec.num_layers} layers, TP 1, seed {seed}")
    if spec.note:
        source += f"; {spec.note}"
    return fit_from_vidur_profile(data_dir / spec.mlp_csv, data_dir / spec.attention_csv,
                                  num_layers=spec.num_layers, name=spec.name,
                                  attention_scale=spec.attention_scale, seed=seed,
                                  source=source)


def print_table(models: list[ExecModel]) -> None:
    keys = sorted({k for m in models for k in m.metrics if not k.endswith("num_holdout")})
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain output without rich
        for model in models:
            print(model.name)
            for key in keys:
                print(f"  {key:36s} {model.metrics.get(key, float('nan')):.4f}")
        return
    table = Table(title="Execution-time model fits (held-out profiling rows)")
    table.add_column("metric")
    for model in models:
        table.add_column(model.name, justify="right")
    for key in keys:
        table.add_row(key, *(f"{m.metrics[key]:.4f}" if key in m.metrics else "-"
                             for m in models))
    Console().print(table)


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
    print_table(models)


if __name__ == "__main__":
    main()
