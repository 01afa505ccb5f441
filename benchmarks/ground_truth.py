"""Our scheduler model against vLLM's own as the cluster benchmark's ground truth.

Runs the discrete-event cluster benchmark (`workers.cluster_sim.simulate`) on identical inputs
(same requests, arrivals, predicted lengths, step-time noise, router draws) with instances
driven by `workers.sim.Scheduler` ("ours"), by the installed vLLM's own
``vllm.v1.core.sched.scheduler.Scheduler`` ("vllm") and by vLLM's ``AsyncScheduler`` with a
batch queue of two, vLLM's default on one GPU ("vllm-async"; see
`workers.cluster_sim.vllm_ground_truth`). Prints per configuration and rate TTFT and
end-to-end p99, preemptions and wall time on each, how many requests' latencies differ from
ours and by how much, the capacity at the SLO on each, then the cost of one scheduler step.

    .venv/bin/python scripts/bench_ground_truth.py --model llama-2-7b-a30 --rates 24:34:2
    .venv/bin/python scripts/bench_ground_truth.py --smoke
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.paths import DATA_DIR
from workers.cluster_sim import (
    SHAREGPT,
    SIMULATED_LENGTH_PREDICTORS,
    ClusterSetup,
    GroundTruthInstance,
    RunResult,
    SimulatedRequest,
    capacity_bounds,
    load_length_trace,
    predictor_from_spec,
    simulate,
)
from workers.cluster_sim.simulation import ground_truth_class
from workers.sim import InstanceConfig, bundled_model

DEFAULT_DATA_DIR = DATA_DIR
NUM_BLOCKS = {"llama-2-7b-a30": 1052, "qwen2-7b-a30": 7289}
DEFAULT_RATES = {"llama-2-7b-a30": "24:34:2", "qwen2-7b-a30": "52:72:4"}
DEFAULT_CONFIGS = ("round_robin", "least_requests", "llumnix", "block", "block@oracle")


@dataclass(frozen=True, slots=True)
class Point:
    config: str
    rate: float
    runs: dict[str, RunResult]

    def abs_diff(self, other: str, attribute: str) -> np.ndarray | None:
        """|ours - other| per request (None when a run was aborted)."""
        ours, theirs = getattr(self.runs["ours"], attribute), getattr(self.runs[other], attribute)
        if not ours or not theirs:
            return None
        return np.abs(np.array(ours) - np.array(theirs))

    def diff_text(self, other: str) -> str:
        ttft, e2e = self.abs_diff(other, "ttft_s"), self.abs_diff(other, "e2e_s")
        if ttft is None or e2e is None:
            return "aborted"
        differing = int(np.count_nonzero(e2e > 1e-9))
        return (f"{differing} ({differing / len(e2e):.0%}); {np.median(ttft):.2g} / "
                f"{ttft.max():.2g}; {np.median(e2e):.2g} / {e2e.max():.2g}")


def instance_config(model: str) -> InstanceConfig:
    """The Block paper's vLLM settings on one A30."""
    return InstanceConfig(num_total_blocks=NUM_BLOCKS[model], block_size=16, max_num_seqs=48,
                          max_num_batched_tokens=512, max_model_len=4096)


def run_one(args: argparse.Namespace, spec: str, rate: float, ground_truth: str) -> RunResult:
    workload = load_length_trace(args.data / SHAREGPT, max_model_len=4096,
                                 num_requests=args.num_requests, seed=args.seed)
    policy, _, predictor = spec.partition("@")
    setup = ClusterSetup(args.num_instances, instance_config(args.model),
                         bundled_model(args.model), publish_interval_s=args.publish_interval,
                         exec_noise_sigma=args.exec_noise, abort_ttft_s=args.abort_ttft,
                         ground_truth=ground_truth)
    return simulate(workload, rate, setup, policy, predictor_from_spec(predictor or args.predictor),
                    seed=args.seed, keep_samples=True)


def _run_job(job: tuple[argparse.Namespace, str, float, str]) -> RunResult:
    result = run_one(*job)
    _, spec, rate, ground_truth = job
    print(f"{spec} at {rate:g} on {ground_truth}: TTFT p99 {result.ttft_p99_s:.3f} s, "
          f"{result.wall_s:.0f} s wall", file=sys.stderr, flush=True)
    return result


def step_cost(args: argparse.Namespace) -> dict[str, tuple[int, float]]:
    """(steps, microseconds per step) of one instance draining a queue, per ground truth."""
    workload = load_length_trace(args.data / SHAREGPT, max_model_len=4096,
                                 num_requests=args.step_cost_requests, seed=args.seed)
    model = bundled_model(args.model)
    cost = {}
    for ground_truth in args.ground_truths:
        cls = ground_truth_class(ground_truth)
        instance: GroundTruthInstance = cls("cost", instance_config(args.model), model)
        for i in range(len(workload)):
            instance.add(SimulatedRequest(f"r{i}", 0.0, workload.num_prompt_tokens[i],
                                          workload.num_output_tokens[i], 1), 0.0)
        started = time.perf_counter()
        instance.run_to_end()
        wall_s = time.perf_counter() - started
        cost[ground_truth] = (instance.num_steps, wall_s / instance.num_steps * 1e6)
    return cost


def parse_rates(text: str) -> list[float]:
    low, high, step = (float(x) for x in text.split(":"))
    return [round(low + k * step, 6) for k in range(int(round((high - low) / step)) + 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--model", default="llama-2-7b-a30", choices=list(NUM_BLOCKS))
    parser.add_argument("--num-requests", type=int, default=10_000)
    parser.add_argument("--num-instances", type=int, default=12)
    parser.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS),
                        help="policy[@predictor] per configuration")
    default_predictor = ("learned-errors" if "learned-errors" in SIMULATED_LENGTH_PREDICTORS.names()
                         else "lognormal:0.15")
    parser.add_argument("--predictor", default=default_predictor,
                        help="length predictor of configs that name none")
    parser.add_argument("--rates", help="rate grid LO:HI:STEP (requests/s, whole fleet)")
    parser.add_argument("--slo", type=float, default=3.0, help="TTFT p99 SLO (s)")
    parser.add_argument("--publish-interval", type=float, default=0.1)
    parser.add_argument("--exec-noise", type=float, default=0.1)
    parser.add_argument("--abort-ttft", type=float, default=20.0)
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--against", nargs="+", default=["vllm", "vllm-async"],
                        choices=["vllm", "vllm-async"],
                        help="ground truths to compare ours with")
    parser.add_argument("--step-cost-requests", type=int, default=300,
                        help="requests one instance drains to time a step (0: skip)")
    parser.add_argument("--smoke", action="store_true",
                        help="3 instances, 600 requests, 2 configs, 2 rates (a few minutes)")
    args = parser.parse_args()
    if args.smoke:
        args.num_instances, args.num_requests = 3, 600
        args.configs = ["least_requests", "block"]
        args.step_cost_requests = min(args.step_cost_requests, 150)
    args.ground_truths = ["ours", *args.against]
    rates = parse_rates(args.rates or DEFAULT_RATES[args.model])
    if args.smoke and not args.rates:
        rates = [r * args.num_instances / 12 for r in (rates[0], rates[-1])]
    width = len(args.ground_truths)
    jobs = [(args, spec, rate, g) for spec in args.configs for rate in rates
            for g in args.ground_truths]
    started = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            results = list(pool.map(_run_job, jobs))
    else:
        results = [_run_job(job) for job in jobs]
    wall_s = time.perf_counter() - started
    points = []
    for index in range(0, len(results), width):
        _, spec, rate, _ = jobs[index]
        points.append(Point(spec, rate, dict(zip(args.ground_truths,
                                                 results[index:index + width], strict=True))))
    print(f"# {args.model}, {args.num_instances} instances, {args.num_requests} ShareGPT "
          f"requests, predictor {args.predictor}, noise {args.exec_noise}, seed {args.seed}; "
          f"{wall_s:.0f} s wall")
    names = " / ".join(args.ground_truths)
    print(f"| config | rate | TTFT p99, {names} (s) | e2e p99 (s) | preemptions | "
          f"wall (s) | " + " | ".join(f"vs {g}: requests differing; abs diff TTFT "
                                       f"p50 / max; e2e p50 / max (s)" for g in args.against)
          + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(args.against))
    for p in points:
        runs = [p.runs[g] for g in args.ground_truths]
        print(f"| {p.config} | {p.rate:g} | "
              + " / ".join(f"{r.ttft_p99_s:.3f}" for r in runs) + " | "
              + " / ".join(f"{r.e2e_p99_s:.2f}" for r in runs) + " | "
              + " / ".join(str(r.num_preemptions) for r in runs) + " | "
              + " / ".join(f"{r.wall_s:.0f}" for r in runs) + " | "
              + " | ".join(p.diff_text(g) for g in args.against) + " |")
    print(f"\n| config | capacity (req/s) at TTFT p99 <= {args.slo:g} s: "
          + " | ".join(args.ground_truths) + " |")
    print("|---|" + "---|" * width)
    for spec in args.configs:
        cells = []
        for g in args.ground_truths:
            by_rate = {p.rate: p.runs[g].ttft_p99_s for p in points if p.config == spec}
            low, high = capacity_bounds(by_rate, args.slo)
            cells.append(f"{low if low is not None else '<'}..{high if high is not None else '>'}")
        print(f"| {spec} | " + " | ".join(cells) + " |")
    if args.step_cost_requests:
        cost = step_cost(args)
        print(f"\nOne instance draining {args.step_cost_requests} requests: "
              + "; ".join(f"{g} {n} steps, {us:.0f} us/step ({us / cost['ours'][1]:.1f}x)"
                          for g, (n, us) in cost.items()))
