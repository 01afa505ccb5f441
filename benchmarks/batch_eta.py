"""Batch completion estimates against a replay of the batch (issue 43's targets): the estimate's
error when the batch is validated and at 25 % progress, beside a per-model-mean estimate's.

Batches of unlike content on two serving models of unlike verbosity (AlpacaEval answers of
many models, ``lengths/alpaca_eval_many_models.jsonl``): for each model, batches of its short
answers, of its long ones and of a mix, twice each over different prompts (12 batches by
default). Prompts are held out: the length head is trained on the other prompts only, with the
shipped recipe (`length_model.train`, MiniLM, as ``blockq models length-train``), and cached.

- Ground truth: `workers.batch.eta.replay`, every line at its TRUE length on the model's
  instances (each its own scheduler and execution-time model), beside a Poisson interactive
  stream of the model's held-out answers, with lognormal step-time noise (``--step-noise``).
- Estimates: `workers.batch.eta.estimate` as the service makes them (a sample of at most
  ``--max-lines`` lines, no noise, another draw of the interactive stream at the same rate and
  shapes), on the lines' lengths predicted by the held-out head ("learned"), or on the
  model's mean answer length over the training prompts ("per-model mean"). At 25 %: the
  unfinished lines, each less the tokens it made, from then, their predicted lengths scaled
  by the batch's finished lines (`length_calibration`), as the service scales them.
- Error: |estimated - true| / true, of the time from the estimate to the batch's last line.

This is the simulated replay: the estimator and the ground truth share the simulator, so the
error here is the length predictions' (and the sampling's, and the noise's), not the
simulator's against the emulated stack's (docs/benchmarks_cluster.md measures that one). The
figures are deterministic for a seed: they do not depend on the machine's load.

Usage::

    python scripts/bench_batch_eta.py [--lines 300] [--rate 2.0] [--seed 0]
        [--head .blockq/batch_eta/length_seed0.npz] [--head-models N] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.paths import DATA_DIR, ROOT
from benchmarks.tables import print_table
from workers.batch.eta import (
    EtaConfig,
    EtaInstance,
    EtaLine,
    InteractiveLoad,
    calibrated,
    estimate,
    expected_tokens,
    length_calibration,
    replay,
    saturated_lines_per_s,
)
from workers.predict.dataset import (
    MANY_MODELS,
    LengthRow,
    read_many_models,
    split_by_prompt,
)
from workers.predict.features import TokenCounter
from workers.predict.length_model import LengthPredictor, TrainConfig, minilm_encoder, train
from workers.sim import InstanceConfig, bundled_model

__all__ = ["BatchSpec", "Outcome", "add_held_out_arguments", "main", "make_batches", "run"]

#: Each model's instances: (execution-time model, KV blocks) x count.
FLEETS = {0: ("qwen2-7b-a30", 7289, 2), 1: ("llama-2-7b-a30", 1052, 2)}
MAX_MODEL_LEN = 4096
TARGETS = {"validation": 0.15, "25 %": 0.10}


@dataclass(frozen=True, slots=True)
class BatchSpec:
    name: str
    model: str
    fleet: int  # key of FLEETS
    rows: tuple[LengthRow, ...]


@dataclass(frozen=True, slots=True)
class Outcome:
    spec: BatchSpec
    true_s: float
    learned_s: float
    mean_s: float
    true_rest_s: float  # from 25 % to the end
    learned_rest_s: float
    mean_rest_s: float
    saturated_lps: float

    def error(self, which: str, at: str) -> float:
        true = self.true_s if at == "validation" else self.true_rest_s
        est = {("learned", "validation"): self.learned_s, ("mean", "validation"): self.mean_s,
               ("learned", "25 %"): self.learned_rest_s, ("mean", "25 %"): self.mean_rest_s}
        return abs(est[which, at] - true) / true


def choose_models(rows: Sequence[LengthRow]) -> tuple[str, str]:
    """A terse and a verbose model: the 20th and 80th percentiles of the models' median answer
    lengths (ties by name)."""
    by_model: dict[str, list[int]] = defaultdict(list)
    for row in rows:
        by_model[row.model].append(row.output_tokens)
    ranked = sorted(by_model, key=lambda m: (statistics.median(by_model[m]), m))
    return ranked[len(ranked) // 5], ranked[(4 * len(ranked)) // 5]


def make_batches(test: Sequence[LengthRow], models: Sequence[str], *, lines: int,
                 seed: int) -> list[BatchSpec]:
    """Per model: prompts that ask for short answers, for long ones, and a mix, twice each
    (other prompts where there are enough; lines drawn with replacement from each pool).

    NOTE: a prompt's kind is what it asks, its median answer over every model, not this
    model's own answer to it: choosing by the answer the estimate is judged on would pick
    each model's own outliers (regression to the mean), not unlike content.
    """
    rng = np.random.default_rng(seed)
    by_prompt: dict[str, list[int]] = defaultdict(list)
    for row in test:
        by_prompt[row.prompt_id].append(row.output_tokens)
    asks = {pid: statistics.median(tokens) for pid, tokens in by_prompt.items()}
    batches = []
    for fleet, model in enumerate(models):
        own = sorted((r for r in test if r.model == model),
                     key=lambda r: (asks[r.prompt_id], r.prompt_id))
        half = len(own) // 2
        pools = {"short": own[:half], "long": own[half:], "mixed": own}
        for kind, pool in pools.items():
            order = rng.permutation(len(pool))
            for copy in range(2):
                part = [pool[i] for i in order[copy::2]] or pool
                picks = rng.integers(0, len(part), size=lines)
                batches.append(BatchSpec(f"{kind}-{copy + 1}", model, fleet,
                                         tuple(part[i] for i in picks)))
    return batches


def add_held_out_arguments(parser: argparse.ArgumentParser) -> None:
    """The held-out split and head: --test-share, --seed, --head (the replay's and the live
    benchmark's)."""
    parser.add_argument("--test-share", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--head", type=Path, default=None,
                        help="held-out head artifact (made and cached when missing)")


def held_out_head(train_rows: Sequence[LengthRow], path: Path) -> LengthPredictor:
    """The head trained on the training prompts only (cached at `path`)."""
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        predictor, _ = train(train_rows, encoder=minilm_encoder(), config=TrainConfig(),
                             sources=[{"name": "alpaca_eval_many_models (training prompts)",
                                       "licence": "CC BY-NC 4.0", "rows": len(train_rows)}])
        predictor.head.save(path)
    return LengthPredictor.load(path, num_threads=1)


def fleet_of(key: int) -> list[EtaInstance]:
    exec_model, blocks, count = FLEETS[key]
    config = InstanceConfig(num_total_blocks=blocks, block_size=16, max_num_seqs=48,
                            max_num_batched_tokens=512, max_model_len=MAX_MODEL_LEN)
    return [EtaInstance(config, bundled_model(exec_model))] * count


def run(args: argparse.Namespace) -> list[Outcome]:
    rows = read_many_models(args.data / MANY_MODELS)
    train_rows, test_rows = split_by_prompt(rows, test_share=args.test_share, seed=args.seed)
    models = choose_models(rows)
    if args.head_models:
        keep = set(models) | set(sorted({r.model for r in train_rows})[:args.head_models])
        train_rows = [r for r in train_rows if r.model in keep]
    head = held_out_head(train_rows, args.head or ROOT / ".blockq" / "batch_eta" /
                         f"length_seed{args.seed}_{args.head_models or 'all'}.npz")
    means = {m: float(np.mean([r.output_tokens for r in train_rows if r.model == m]))
             for m in models}
    counter = TokenCounter()
    outcomes = []
    for i, spec in enumerate(make_batches(test_rows, models, lines=args.lines, seed=args.seed)):
        outcomes.append(_one(spec, head, counter, means[spec.model], args, seed=args.seed + i,
                             interactive=[r for r in test_rows if r.model == spec.model]))
    return outcomes


def _one(spec: BatchSpec, head: LengthPredictor, counter: TokenCounter, mean: float,
         args: argparse.Namespace, *, seed: int, interactive: Sequence[LengthRow]) -> Outcome:
    prompts = [counter(r.prompt) for r in spec.rows]
    room = [max(1, MAX_MODEL_LEN - p) for p in prompts]
    truth_lines = [EtaLine(p, min(r.output_tokens, c))
                   for p, r, c in zip(prompts, spec.rows, room, strict=True)]
    predicted = head.predict_batch([r.prompt for r in spec.rows], spec.model, room)
    learned = [(p.tokens, p.p90_tokens) for p in predicted]
    means = [(min(round(mean), c), None) for c in room]
    shapes = tuple((counter(r.prompt), r.output_tokens) for r in interactive)
    load = InteractiveLoad(args.rate, shapes)
    fleet = fleet_of(spec.fleet)
    truth, quarter = replay(truth_lines, fleet, load, EtaConfig(
        max_in_flight=args.window, seed=seed, step_noise=args.step_noise), checkpoint=0.25)
    config = EtaConfig(max_in_flight=args.window, max_lines=args.max_lines, seed=seed + 1000)

    def at_start(lengths: Sequence[tuple[int, int | None]]) -> float:
        return estimate([EtaLine(p, expected_tokens(m, p90, c)) for p, (m, p90), c in zip(
            prompts, lengths, room, strict=True)], fleet, load, config).seconds

    def at_quarter(lengths: Sequence[tuple[int, int | None]]) -> float:
        # The batch's own finished lines correct its predicted lengths, as the service does.
        unfinished = dict(quarter.unfinished)
        ratio = length_calibration(
            [expected_tokens(m, p90, c) for (m, p90), c in zip(lengths, room, strict=True)],
            [None if i in unfinished else line.output_tokens
             for i, line in enumerate(truth_lines)])
        rest = [EtaLine(prompts[i] + made, expected_tokens(
                    *calibrated(*lengths[i], ratio), room[i], made=made) - made)
                for i, made in quarter.unfinished]
        return estimate(rest, fleet, load, config).seconds

    return Outcome(spec, truth.seconds, at_start(learned), at_start(means),
                   truth.seconds - quarter.at_s, at_quarter(learned), at_quarter(means),
                   saturated_lines_per_s(truth_lines, fleet, EtaConfig(
                       max_in_flight=args.window, max_lines=len(truth_lines))))


def report(outcomes: Sequence[Outcome], args: argparse.Namespace) -> None:
    def pct(x: float) -> str:
        return f"{100 * x:.1f}%"

    rows = []
    for o in outcomes:
        true_mean = statistics.mean(r.output_tokens for r in o.spec.rows)
        rows.append([o.spec.model, o.spec.name, str(len(o.spec.rows)), f"{true_mean:.0f}",
                     f"{o.true_s:.0f}",
                     f"{o.learned_s:.0f} ({pct(o.error('learned', 'validation'))})",
                     f"{o.mean_s:.0f} ({pct(o.error('mean', 'validation'))})",
                     f"{o.true_rest_s:.0f}",
                     f"{o.learned_rest_s:.0f} ({pct(o.error('learned', '25 %'))})",
                     f"{o.mean_rest_s:.0f} ({pct(o.error('mean', '25 %'))})",
                     f"{o.saturated_lps:.2f}"])
    print_table("batches: simulated seconds to the last line (estimate's error)",
                ["model", "batch", "lines", "mean answer", "true s", "learned s",
                 "per-model mean s", "true s from 25 %", "learned", "per-model mean",
                 "alone: lines/s"], rows, markdown=args.markdown)
    summary = []
    for at, target in TARGETS.items():
        learned = statistics.median(o.error("learned", at) for o in outcomes)
        mean = statistics.median(o.error("mean", at) for o in outcomes)
        summary.append([f"median |error| at {at}", pct(learned), pct(mean), f"<= {pct(target)}",
                        "yes" if learned <= target else "no"])
    print_table(f"targets over {len(outcomes)} batches", ["figure", "learned", "per-model mean",
                                                           "target", "met"], summary,
                markdown=args.markdown)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA_DIR)
    parser.add_argument("--lines", type=int, default=300, help="lines a batch")
    parser.add_argument("--rate", type=float, default=2.0,
                        help="interactive requests a second on each model's instances")
    parser.add_argument("--window", type=int, default=96, help="batch lines in flight at most")
    parser.add_argument("--max-lines", type=int, default=2000,
                        help="lines an estimate simulates at most (Settings.batch_eta_max_lines)")
    parser.add_argument("--step-noise", type=float, default=0.1,
                        help="sigma of the ground truth's lognormal step-time noise")
    add_held_out_arguments(parser)
    parser.add_argument("--head-models", type=int, default=0,
                        help="train the head on this many models besides the two served (0: "
                             "all; a smaller head is quicker to train, for a smoke run)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    print(f"load average at start: {' / '.join(f'{x:.2f}' for x in os.getloadavg())} "
          "(the figures are simulated and deterministic: they do not depend on it)")
    started = time.process_time()
    outcomes = run(args)
    report(outcomes, args)
    print(f"{len(outcomes)} batches; {time.process_time() - started:.0f} s of CPU; load average "
          f"at end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0
