"""Time one what-if prediction (`workers.sim.predict_what_if`) on realistic instance snapshots.

Snapshots use the Block paper's A30 Qwen2-7B setup (max_num_seqs 48, 512-token budget,
block size 16, 7289 KV blocks, max_model_len 4096) and ShareGPT prompt/output lengths
from ``<data>/traces/vidur_opt_scheduler/sharegpt_val_10k_llama2.csv``. For each size,
every running request is part-way through its output (the last admitted one still
prefilling), a quarter as many requests wait, and the new request is drawn from the same
trace. Predicted lengths are the true ones times a factor in [0.7, 1.3], so some running
requests have outrun their prediction. Each prediction runs on a fresh snapshot and is
timed alone, twice: from the raw snapshot (`predict_what_if`), and from a snapshot
normalised beforehand (`prepare` + `predict_what_if_prepared`, what a predictor does for
the several requests it routes between two snapshot publications). The step-by-step
reference is timed on a few cases for comparison.

``--future-rate R`` adds the expected-future-load term (`FutureLoad`): R requests per second
of the trace's mean shape arrive during the new request's lifetime (the paper's 20-36 req/s
over 12 instances is 1.7-3 req/s per instance).

Usage::

    python scripts/bench_sim.py [--data DIR] [--model NAME] [--sizes 8 24 48]
                                [--repeats N] [--reference-repeats N] [--seed S]
                                [--future-rate R] [--markdown]
"""

from __future__ import annotations

import argparse
import csv
import random
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks import quiet
from benchmarks.paths import DATA_DIR
from benchmarks.tables import print_table
from workers.sim import (
    ExecModel,
    FutureLoad,
    InstanceConfig,
    InstanceSnapshot,
    OverrunPolicy,
    SimRequest,
    WhatIf,
    bundled_model,
    predict_what_if,
    predict_what_if_prepared,
    predict_what_if_stepwise,
    prepare,
)

NO_FUTURE_LOAD = FutureLoad()
#: ``../shared/data`` next to the repository checkout.
DEFAULT_DATA_DIR = DATA_DIR
TRACE = Path("traces/vidur_opt_scheduler/sharegpt_val_10k_llama2.csv")
A30_QWEN2_7B = InstanceConfig(num_total_blocks=7289, block_size=16, max_num_seqs=48,
                              max_num_batched_tokens=512, max_model_len=4096)


@dataclass(frozen=True, slots=True)
class Row:
    num_running: int
    num_waiting: int
    median_us: float
    p99_us: float
    prepared_median_us: float
    prepared_p99_us: float
    mean_steps: float
    reference_median_us: float


def load_lengths(path: Path, max_model_len: int) -> list[tuple[int, int]]:
    with open(path, newline="") as handle:
        rows = [(int(r["num_prefill_tokens"]), int(r["num_decode_tokens"]))
                for r in csv.DictReader(handle)]
    return [(p, d) for p, d in rows if p + d <= max_model_len and d > 0]


def make_case(rng: random.Random, lengths: list[tuple[int, int]], num_running: int,
              config: InstanceConfig) -> tuple[InstanceSnapshot, SimRequest]:
    requests, held = [], 0
    for i in range(num_running):
        prompt, output = rng.choice(lengths)
        predicted = max(1, round(output * rng.uniform(0.7, 1.3)))
        if i == num_running - 1:  # the latest admitted request is still prefilling
            generated, computed = 0, rng.randrange(prompt)
        else:
            generated = rng.randrange(output)
            computed = prompt + generated - 1 if generated else prompt - 1
        held += -(-computed // config.block_size)
        requests.append(SimRequest(f"r{i}", prompt, computed, generated, predicted, True))
    for i in range(num_running // 4):
        prompt, output = rng.choice(lengths)
        requests.append(SimRequest(f"w{i}", prompt, 0, 0,
                                   max(1, round(output * rng.uniform(0.7, 1.3))), False))
    prompt, output = rng.choice(lengths)
    new = SimRequest("new", prompt, predicted_output_tokens=output)
    return InstanceSnapshot(config, config.num_usable_blocks - held, tuple(requests)), new


def time_us(predict: Callable[..., WhatIf], cases: list[tuple], model: ExecModel,
            *extra: object) -> tuple[list[float], list[int]]:
    """Microseconds per call of ``predict(*case, model, *extra)``, and the steps each simulated."""
    times, steps = [], []
    for case in cases:
        start = time.perf_counter_ns()
        result = predict(*case, model, *extra)
        times.append((time.perf_counter_ns() - start) / 1000.0)
        steps.append(result.num_steps)
    return times, steps


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else values[0]


def bench(size: int, lengths: list[tuple[int, int]], model: ExecModel, repeats: int,
          reference_repeats: int, seed: int, future: FutureLoad = NO_FUTURE_LOAD) -> Row:
    rng = random.Random(seed + size)
    cases = [make_case(rng, lengths, size, A30_QWEN2_7B) for _ in range(repeats)]
    prepared = [(prepare(snapshot), new) for snapshot, new in cases]
    overrun = OverrunPolicy()
    time_us(predict_what_if, cases[:20], model, overrun, future)  # warm caches
    times, steps = time_us(predict_what_if, cases, model, overrun, future)
    prepared_times, _ = time_us(predict_what_if_prepared, prepared, model, future)
    reference, _ = time_us(predict_what_if_stepwise, cases[:reference_repeats], model, overrun,
                           future)
    return Row(size, size // 4, statistics.median(times), p99(times),
               statistics.median(prepared_times), p99(prepared_times), statistics.fmean(steps),
               statistics.median(reference) if reference else float("nan"))


HEADERS = ("running", "waiting", "median us", "p99 us", "prepared median us", "prepared p99 us",
           "steps", "step-by-step median us", "speed-up")


def cells(row: Row) -> tuple[str, ...]:
    return (str(row.num_running), str(row.num_waiting), f"{row.median_us:.0f}",
            f"{row.p99_us:.0f}", f"{row.prepared_median_us:.0f}", f"{row.prepared_p99_us:.0f}",
            f"{row.mean_steps:.0f}", f"{row.reference_median_us:.0f}",
            f"{row.reference_median_us / row.median_us:.0f}x")


def print_rows(rows: list[Row], title: str, markdown: bool) -> None:
    print_table(title, HEADERS, [cells(row) for row in rows], markdown=markdown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR,
                        help="shared data directory (default: ../shared/data)")
    parser.add_argument("--model", default="qwen2-7b-a30", help="bundled execution-time model")
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 24, 48],
                        help="running requests per snapshot")
    parser.add_argument("--repeats", type=int, default=1000, help="predictions per size")
    parser.add_argument("--reference-repeats", type=int, default=10,
                        help="step-by-step predictions per size, for the speed-up column")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--future-rate", type=float, default=0.0,
                        help="expected future arrivals per second (the trace's mean shape)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    with quiet.alone():  # measured alone, on a quiet machine
        lengths = load_lengths(args.data / TRACE, A30_QWEN2_7B.max_model_len)
        model = bundled_model(args.model)
        future = NO_FUTURE_LOAD
        if args.future_rate > 0:
            future = FutureLoad(args.future_rate, statistics.fmean(p for p, _ in lengths),
                                statistics.fmean(d for _, d in lengths))
        rows = [bench(size, lengths, model, args.repeats, args.reference_repeats, args.seed, future)
                for size in args.sizes]
        title = f"One what-if prediction, {args.model}, A30 Qwen2-7B instance"
        if future.active:
            title += (f", future load {future.rate_per_s:g} req/s of {future.num_prompt_tokens:.0f}"
                      f" + {future.num_output_tokens:.0f} tokens")
        print_rows(rows, title, args.markdown)
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak RSS of this process: {peak_mb:.0f} MB")
