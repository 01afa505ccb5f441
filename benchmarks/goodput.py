"""Goodput under mixed per-request latency targets: requests that met their targets per second.

Issue 15, item 2. The cluster simulation (`workers.cluster_sim`, as `scripts/bench_cluster.py`
runs it: 12 A30 instances, the Block paper's vLLM settings, ShareGPT lengths, Poisson arrivals,
states published every 100 ms, predicted lengths from the shipped model's measured errors) with
a seeded mix of targets (`workers.cluster_sim.TargetMix`: 40 % TTFT <= 1 s, 30 % end-to-end <=
2 s + 60 ms per output token, 30 % none). The same requests, arrivals, predictions and targets
for every configuration:

- round_robin, least_requests, llumnix, block: route without reading the targets;
- block+targets: the router sends each request to an instance whose what-if meets its target,
  the one delaying the others least (`workers.route.policies.decide`), else block's pick;
- block+targets+refuse: as above, but a request no instance can meet is refused at once (the
  API answers 429/503 with a reason; here it is simply not run); `+refuse>0.25` refuses only
  when the best instance's what-if misses the target by more than 25 % of it (a margin for
  the what-if's own error: stale states, predicted lengths).

A request without a target counts as met when it finishes; a refused request is not met.
Goodput is met requests per second of arrivals (first to last arrival), so at most the rate.
Latencies are simulated time: the machine's load changes only the wall time.

    python scripts/bench_goodput.py [--model llama-2-7b-a30] [--rates 24 28 32 36 40]
        [--num-requests 4000] [--jobs 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks.cluster import (
    DEFAULT_DATA_DIR,
    load_workload,
    model_setup,
)
from benchmarks.psf import EXEC_NOISE  # step noise per model, as there
from workers.cluster_sim import (
    DEFAULT_PREDICTOR,
    ClusterSetup,
    LatencyTarget,
    TargetMix,
    Workload,
    draw_targets,
    predictor_from_spec,
    simulate,
)

BASELINES = ("round_robin", "least_requests", "llumnix", "block")
DEFAULT_MIX = TargetMix()


@dataclasses.dataclass(frozen=True, slots=True)
class Job:
    workload: Workload
    setup: ClusterSetup
    config: str
    predictor: str
    rate: float
    seed: int
    targets: tuple[LatencyTarget | None, ...]


def parse_config(config: str) -> tuple[str, bool, float | None]:
    """'block+targets+refuse>0.25' -> (policy, routes by targets, refusal margin or None)."""
    policy, *flags = config.split("+")
    refuse = next((f for f in flags if f.startswith("refuse")), None)
    margin = None if refuse is None else float(refuse.removeprefix("refuse").removeprefix(">") or 0)
    return policy, "targets" in flags, margin


def refusing(margin: float) -> str:
    return "block+targets+refuse" + (f">{margin:g}" if margin else "")


def run_job(job: Job) -> dict[str, float]:
    """One configuration at one rate: goodput and how it came about."""
    policy, targeted, refuse_margin = parse_config(job.config)
    result = simulate(job.workload, job.rate, job.setup, policy,
                      predictor_from_spec(job.predictor), seed=job.seed, targets=job.targets,
                      route_by_targets=targeted, reject_unmeetable=refuse_margin is not None,
                      refuse_margin=refuse_margin or 0.0)
    return {"config": job.config, "rate": job.rate, "goodput_rps": result.goodput_rps,
            "met_share": result.num_met / len(job.workload), "refused": result.num_rejected,
            "ttft_p99_s": result.ttft_p99_s, "e2e_p50_s": result.e2e_p50_s,
            "wall_s": result.wall_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--model", default="llama-2-7b-a30", choices=list(EXEC_NOISE))
    parser.add_argument("--rates", type=float, nargs="+", default=[24.0, 28.0, 32.0, 36.0, 40.0])
    parser.add_argument("--num-requests", type=int, default=4000)
    parser.add_argument("--num-instances", type=int, default=12)
    parser.add_argument("--predictor", default=DEFAULT_PREDICTOR)
    parser.add_argument("--ttft-share", type=float, default=DEFAULT_MIX.ttft_share)
    parser.add_argument("--ttft-target", type=float, default=DEFAULT_MIX.ttft_s)
    parser.add_argument("--e2e-share", type=float, default=DEFAULT_MIX.e2e_share)
    parser.add_argument("--e2e-per-token", type=float, default=DEFAULT_MIX.e2e_per_token_s)
    parser.add_argument("--e2e-slack", type=float, default=DEFAULT_MIX.e2e_slack_s)
    parser.add_argument("--refuse-margins", type=float, nargs="+", default=[0.0, 0.25],
                        help="refuse a request when the best what-if misses its target by more "
                             "than this share of it (one configuration each)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    started = time.perf_counter()
    args.workload = "sharegpt"
    workload = load_workload(args)
    setup = model_setup(args.model, argparse.Namespace(
        num_instances=args.num_instances, publish_interval=0.1,
        exec_noise=EXEC_NOISE[args.model], abort_ttft=None))
    mix = TargetMix(args.ttft_share, args.ttft_target, args.e2e_share, args.e2e_per_token,
                    args.e2e_slack)
    targets = tuple(draw_targets(workload.num_output_tokens, mix, args.seed))
    configs = [*BASELINES, "block+targets", *(refusing(m) for m in args.refuse_margins)]
    jobs = [Job(workload, setup, config, args.predictor, rate, args.seed, targets)
            for rate in args.rates for config in configs]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(run_job, jobs))
    _print(rows, args, mix)
    print(f"\n({time.perf_counter() - started:.0f} s wall, {len(jobs)} runs)")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "mix": dataclasses.asdict(mix), "rows": rows},
                                        indent=1))


def _print(rows: list[dict[str, float]], args: argparse.Namespace, mix: TargetMix) -> None:
    print(f"**{args.model}, {args.num_instances} instances, {args.num_requests} ShareGPT "
          f"requests, predictor {args.predictor}; targets: {mix.ttft_share:.0%} TTFT <= "
          f"{mix.ttft_s:g} s, {mix.e2e_share:.0%} e2e <= {mix.e2e_slack_s:g} s + "
          f"{mix.e2e_per_token_s * 1000:g} ms/token, the rest none**\n")
    print("| rate/s | config | goodput/s | met | refused | vs best without targets "
          "| TTFT p99 s (run requests) | e2e p50 s |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for rate in args.rates:
        mine = [r for r in rows if r["rate"] == rate]
        best = max(r["goodput_rps"] for r in mine if r["config"] in BASELINES)
        for r in mine:
            print(f"| {rate:g} | {r['config']} | {r['goodput_rps']:.2f} | {r['met_share']:.1%} "
                  f"| {int(r['refused'])} | {r['goodput_rps'] / best:.2f}x "
                  f"| {r['ttft_p99_s']:.2f} | {r['e2e_p50_s']:.2f} |")
