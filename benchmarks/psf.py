"""Predicted-shortest-first inside engines vs FCFS: mean and p99 latency at the same load.

Issue 15, item 3. The cluster simulation (`workers.cluster_sim`, as `scripts/bench_cluster.py`
runs it: 12 A30 instances, the Block paper's vLLM settings, ShareGPT lengths, Poisson arrivals,
the router seeing published states every 100 ms) with every instance scheduling either FCFS or
by vLLM's priority policy with predicted-shortest-first priorities (`workers.sim.request_priority`:
arrival ms + alpha x predicted output tokens, from the predictor's lengths). The router's
what-ifs model the same policy. First the FCFS capacity of the routing policy (the highest rate
whose TTFT p99 stays under the SLO, bisected), then FCFS and priority (one run per alpha) at
each of ``--loads`` x that capacity, the same requests, arrivals, predictions and step-time noise.

Models: ``qwen2-7b-a30`` with the live benchmark's settings (``--live-settings`` in
bench_cluster: step-time noise 0.05) and ``llama-2-7b-a30`` (noise 0.1, bench_cluster's
default). Latencies are simulated time: the machine's load changes only the wall time.

Usage::

    python scripts/bench_psf.py [--models qwen2-7b-a30 llama-2-7b-a30] [--num-requests 4000]
        [--policy block] [--predictor learned-errors] [--alphas 2 20] [--loads 0.8 1.0]
        [--capacity qwen2-7b-a30=63] [--bisect 2] [--jobs 2] [--seed 0] [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks.cluster import (
    DEFAULT_DATA_DIR,
    LIVE_EXEC_NOISE,
    LIVE_MODEL,
    load_workload,
    model_setup,
    parse_rates,
)
from workers.cluster_sim import (
    DEFAULT_PREDICTOR,
    ClusterSetup,
    RunResult,
    Workload,
    capacity_bounds,
    predictor_from_spec,
    simulate,
)

#: Step-time noise per model: the live benchmark's for Qwen2 (emulated engines), else
#: bench_cluster's default.
EXEC_NOISE = {LIVE_MODEL: LIVE_EXEC_NOISE, "llama-2-7b-a30": 0.1}
#: Capacity search grids (req/s, 12 instances), around block's capacities.
SEARCH_RATES = {LIVE_MODEL: "52:68:4", "llama-2-7b-a30": "26:34:2"}
SLO_S = 3.0


@dataclasses.dataclass(frozen=True, slots=True)
class Job:
    workload: Workload
    setup: ClusterSetup
    policy: str
    predictor: str
    rate: float
    seed: int


def run_job(job: Job) -> RunResult:
    return simulate(job.workload, job.rate, job.setup, job.policy,
                    predictor_from_spec(job.predictor), seed=job.seed, keep_samples=True)


def with_policy(setup: ClusterSetup, alpha: float | None) -> ClusterSetup:
    """`setup` with FCFS engines (alpha None) or predicted-shortest-first at `alpha` ms/token."""
    if alpha is None:
        return setup
    config = dataclasses.replace(setup.config, scheduling_policy="priority",
                                 priority_ms_per_token=alpha)
    return dataclasses.replace(setup, config=config)


def fcfs_capacity(model: str, args: argparse.Namespace, workload: Workload, setup: ClusterSetup,
                  pool: ProcessPoolExecutor) -> float:
    """The FCFS fleet's capacity (TTFT p99 <= SLO) on a grid, then bisected."""
    rates = parse_rates(args.rates.get(model, SEARCH_RATES[model]), args.num_instances / 12)
    p99: dict[float, float] = {}

    def run(wanted: Sequence[float]) -> None:
        jobs = [Job(workload, setup, args.policy, args.predictor, r, args.seed) for r in wanted]
        for rate, result in zip(wanted, pool.map(run_job, jobs), strict=True):
            p99[rate] = result.ttft_p99_s
            print(f"  {model} fcfs {rate:7.2f}/s  ttft p99 {result.ttft_p99_s:7.2f}s "
                  f"({result.wall_s:.0f}s)", flush=True)

    run(rates)
    step = rates[1] - rates[0] if len(rates) > 1 else rates[0] / 4
    for _ in range(args.bisect + 6):
        low, high = capacity_bounds(p99, SLO_S)
        if low is None:
            run([round(min(p99) - step, 3)])
        elif high is None:
            run([round(max(p99) + step, 3)])
        elif high - low > step / 2 ** args.bisect * 1.01:
            run([round((low + high) / 2, 3)])
        else:
            break
    low, _ = capacity_bounds(p99, SLO_S)
    assert low is not None
    return low


def summary(result: RunResult) -> dict[str, float]:
    e2e, ttft = result.e2e_s, result.ttft_s
    return {"e2e_mean_s": statistics.fmean(e2e), "e2e_p50_s": result.e2e_p50_s,
            "e2e_p99_s": result.e2e_p99_s, "ttft_mean_s": statistics.fmean(ttft),
            "ttft_p99_s": result.ttft_p99_s, "preemptions": result.num_preemptions,
            "wall_s": result.wall_s}


def run_model(model: str, args: argparse.Namespace, workload: Workload,
              pool: ProcessPoolExecutor) -> dict:
    started = time.perf_counter()
    model_args = argparse.Namespace(**vars(args), exec_noise=EXEC_NOISE[model],
                                    publish_interval=0.1, abort_ttft=None)
    setup = model_setup(model, model_args)
    capacity = args.capacity.get(model) or fcfs_capacity(model, args, workload, setup, pool)
    alphas: list[float | None] = [None, *args.alphas]
    points = [(load, alpha) for load in args.loads for alpha in alphas]
    jobs = [Job(workload, with_policy(setup, alpha), args.policy, args.predictor,
                round(load * capacity, 3), args.seed) for load, alpha in points]
    rows: dict[float, dict[str, dict[str, float]]] = {}
    for (load, alpha), result in zip(points, pool.map(run_job, jobs), strict=True):
        label = "fcfs" if alpha is None else f"priority alpha={alpha:g}"
        rows.setdefault(load, {})[label] = summary(result)
    print(f"\n**{model}: {args.policy}@{args.predictor}, FCFS capacity {capacity:g} req/s "
          f"(TTFT p99 <= {SLO_S:g} s), {len(workload)} requests**\n")
    print("| load | engines | e2e mean s | vs FCFS | e2e p50 s | e2e p99 s | p99 vs FCFS "
          "| TTFT mean s | TTFT p99 s | preemptions |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for load, by_label in rows.items():
        fcfs = by_label["fcfs"]
        for label, row in by_label.items():
            print(f"| {load:g} x = {load * capacity:.1f}/s | {label} | {row['e2e_mean_s']:.2f} | "
                  f"{(row['e2e_mean_s'] / fcfs['e2e_mean_s'] - 1) * 100:+.1f}% | "
                  f"{row['e2e_p50_s']:.2f} | {row['e2e_p99_s']:.2f} | "
                  f"{row['e2e_p99_s'] / fcfs['e2e_p99_s']:.2f}x | {row['ttft_mean_s']:.2f} | "
                  f"{row['ttft_p99_s']:.2f} | {row['preemptions']} |")
    wall_s = time.perf_counter() - started
    print(f"\n({model}: {wall_s:.0f} s wall)", flush=True)
    return {"model": model, "capacity_fcfs": capacity,
            "rows": {str(load): by_label for load, by_label in rows.items()}, "wall_s": wall_s}


def parse_capacity(specs: Sequence[str]) -> dict[str, float]:
    return {model: float(rate) for model, _, rate in (s.partition("=") for s in specs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--models", nargs="+", default=[LIVE_MODEL, "llama-2-7b-a30"],
                        choices=list(EXEC_NOISE))
    parser.add_argument("--num-requests", type=int, default=4000)
    parser.add_argument("--num-instances", type=int, default=12)
    parser.add_argument("--policy", default="block")
    parser.add_argument("--predictor", default=DEFAULT_PREDICTOR)
    parser.add_argument("--alphas", type=float, nargs="+", default=[2.0],
                        help="priority ms per predicted output token, one run each")
    parser.add_argument("--loads", type=float, nargs="+", default=[0.8],
                        help="fractions of the FCFS capacity to compare at")
    parser.add_argument("--capacity", nargs="*", default=[], metavar="MODEL=RATE",
                        help="skip the capacity search for these models")
    parser.add_argument("--rates", nargs="*", default=[], metavar="MODEL=LO:HI:STEP",
                        help="capacity search grids (12 instances; defaults: SEARCH_RATES)")
    parser.add_argument("--bisect", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.capacity = parse_capacity(args.capacity)
    args.rates = {model: grid for model, _, grid in (s.partition("=") for s in args.rates)}
    args.workload = "sharegpt"
    workload = load_workload(args)
    reports = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for model in args.models:
            reports.append(run_model(model, args, workload, pool))
    if args.json:
        args.data = str(args.data)
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "models": reports}, indent=1))
