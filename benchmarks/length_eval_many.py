"""Evaluate the length model on many models' answers (``lengths/`` in the shared data folder).

Held-out prompts (K folds by prompt, every model in training): the effects model on each
encoder against the per-model median, per-model mean and log-log prompt-length regression, and
the cross-model reference (ceiling). New serving models (``--new-models``): models held out of
training, calibrated by the online loop's correction after 0, 50 and 200 of their answers, against
the baselines given the same answers. ``--cost``: CPU ms per prompt of a prediction, batched and
one prompt at a time, on one core, measured alone. Logic in `workers.learn.evaluation`.

Usage::

    python scripts/eval_length_many.py [--data DIR] [--folds 5] [--encoders static minilm features]
    python scripts/eval_length_many.py --new-models 20 [--folds 3]
    python scripts/eval_length_many.py --cost [--num-prompts 512]
"""

from __future__ import annotations

import argparse
import os
import random
from pathlib import Path

from rich.console import Console

from benchmarks import quiet
from benchmarks.tables import markdown_table, print_table
from workers.learn import evaluation
from workers.predict.dataset import (
    DEFAULT_DATA_DIR,
    MANY_MODELS,
    load_benchmark_prompts,
    read_many_models,
)
from workers.predict.encoder import Encoder, EncoderConfig
from workers.predict.length_model import make_encoder, minilm_encoder, train

ENCODERS = {
    "static": ("static embeddings (distilled MiniLM, 128 dims) + features + neighbours "
               "(shipped for CPUs without AMX)", lambda: make_encoder("static")),
    "minilm": ("MiniLM-L6 (6 layers, 64 tokens, torch) + features + neighbours (shipped for "
               "CPUs with AMX)", minilm_encoder),
    "minilm-eager": ("the same MiniLM run eagerly (not traced and frozen: the cost before)",
                     lambda: Encoder(EncoderConfig(num_threads=1, frozen=False))),
    "features": ("cheap features only (length, regexes)", evaluation.FeaturesOnly),
}


def _table(title: str, results: dict, console: Console, markdown: bool) -> None:
    best = min(results[b]["mae_tokens"] for b in evaluation.BASELINES)
    headers = ("method", "MAE (tokens)", "vs best baseline", "median rel. error", "within ±25%",
               "Spearman")
    rows = [(name, f"{m['mae_tokens']:.1f}", f"{1 - m['mae_tokens'] / best:+.1%}",
             f"{m['median_rel_error']:.3f}", f"{m['within_25pct']:.1%}", f"{m['spearman']:.3f}")
            for name, m in results.items()]
    print_table(title, headers, rows)
    if markdown:
        print(markdown_table(headers, rows) + "\n")


def _cost(rows: list, args: argparse.Namespace, console: Console) -> None:
    """Each encoder's CPU per prompt, batched and one prompt at a time, measured alone (the
    test services' lock held; the load average printed at the start and at the end)."""
    quiet.wait_for_quiet(args.quiet_load)
    prompts = load_benchmark_prompts(args.data)
    random.Random(0).shuffle(prompts)
    prompts = prompts[: args.num_prompts]
    subset = rows[::6]  # a head per encoder; its size does not change the cost
    for key in args.encoders:
        label, make = ENCODERS[key]
        predictor, _ = train(subset, encoder=make())
        batched = evaluation.cost_per_prompt(predictor, prompts)
        alone = evaluation.cost_per_prompt(predictor, prompts, batch_size=1)
        paced = evaluation.cost_per_prompt(predictor, prompts[:64], batch_size=1,
                                           gap_s=args.gap_ms / 1000)
        console.print(f"{label}: {batched:.2f} ms CPU per prompt in batches of 32, "
                      f"{alone:.2f} one prompt at a time, {paced:.2f} one prompt every "
                      f"{args.gap_ms:.0f} ms ({len(prompts)} prompts; 64 paced)")
    console.print("load average at the end: "
                  + " / ".join(f"{x:.2f}" for x in os.getloadavg()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--encoders", nargs="+", choices=sorted(ENCODERS), default=["static"])
    parser.add_argument("--new-models", type=int, default=0, metavar="N",
                        help="hold N models out of training and calibrate them online")
    parser.add_argument("--counts", type=int, nargs="+", default=[0, 50, 200])
    parser.add_argument("--cost", action="store_true", help="time a prediction per encoder")
    parser.add_argument("--num-prompts", type=int, default=512)
    parser.add_argument("--gap-ms", type=float, default=125.0,
                        help="--cost's paced column: the pause before each one-prompt call")
    parser.add_argument("--quiet-load", type=float, default=1.5,
                        help="--cost waits for the 1-minute load average to fall below this")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    console = Console(width=200)
    rows = read_many_models(args.data / MANY_MODELS)
    console.print(f"{len(rows)} answers, {len({r.prompt_id for r in rows})} prompts, "
                  f"{len({r.model for r in rows})} models; load average "
                  f"{os.getloadavg()[0]:.1f}")
    if args.cost:
        with quiet.measurement():
            _cost(rows, args, console)
        return 0
    if args.new_models:
        held = evaluation.choose_new_models(rows, args.new_models)
        console.print(f"held-out models: {', '.join(held)}")
        results = evaluation.new_models(rows, ENCODERS[args.encoders[0]][1](), held,
                                        counts=args.counts, num_folds=args.folds)
        for n, methods in results.items():
            _table(f"New serving models after {n} answers ({len(held)} models held out, "
                   f"{args.folds} prompt folds)", methods, console, args.markdown)
        return 0
    encoders = {ENCODERS[k][0]: ENCODERS[k][1]() for k in args.encoders}
    results = evaluation.known_models(rows, encoders, num_folds=args.folds)
    _table(f"Held-out prompts, every model in training ({args.folds}-fold CV by prompt)",
           results, console, args.markdown)
    return 0
