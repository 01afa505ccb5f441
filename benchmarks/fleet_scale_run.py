"""Routing at internet scale, in simulation: the command line of scripts/bench_fleet_scale.py
(usage there; the logic in benchmarks/fleet_scale.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks import quiet
from benchmarks.fleet_scale import decision_cost, mixed_fleet, run_point, sharegpt
from benchmarks.paths import DATA_DIR
from benchmarks.tables import fmt, print_table


def _rates(spec: str) -> list[float]:
    low, high, step = (float(x) for x in spec.split(":"))
    count = int(round((high - low) / step)) + 1
    return [round(low + i * step, 3) for i in range(count)]


def cost(args: argparse.Namespace) -> None:
    """A timing: alone (the test services' lock), on a quiet machine."""
    rows = []
    with quiet.alone(args.quiet_load):
        for size in args.sizes:
            for policy in args.policies:
                c = decision_cost(size, policy, num_decisions=args.decisions)
                rows.append([str(size), str(c.num_candidates), policy,
                             fmt(c.p50_us / 1000, 3), fmt(c.p99_us / 1000, 3)])
    print_table("one routing decision (decide_route), ms of wall time",
                ["instances", "of its model", "policy", "p50 ms", "p99 ms"], rows)


def capacity(args: argparse.Namespace) -> None:
    workload = sharegpt(args.data, args.num_requests)
    members = mixed_fleet(args.instances)
    rows = []
    for policy in args.policies:
        for rate in _rates(args.rates):
            r = run_point(workload, rate, members, policy)
            rows.append([policy, fmt(rate, 1), fmt(rate / args.instances, 3),
                         "overload" if r.aborted else fmt(r.ttft_p99_s),
                         fmt(r.decision_us_p50 / 1000, 3), fmt(r.wall_s, 0)])
            print(f"  {policy} {rate}/s ttft p99 {r.ttft_p99_s:.2f}s ({r.wall_s:.0f}s)",
                  flush=True)
    print_table(f"{args.instances} instances (1/3 A100, 2/3 A30), {len(workload)} requests: "
                "TTFT p99 by rate", ["policy", "rate", "per instance", "TTFT p99 s",
                                     "decision p50 ms", "wall s"], rows)


def herd(args: argparse.Namespace) -> None:
    workload = sharegpt(args.data, args.num_requests)
    members = mixed_fleet(args.instances)
    rows = []
    for routers in args.routers:
        r = run_point(workload, args.rate, members, args.policy, num_routers=routers,
                      decision_s=args.decision_ms / 1000)
        rows.append([str(routers), "overload" if r.aborted else fmt(r.ttft_p50_s),
                     "overload" if r.aborted else fmt(r.ttft_p99_s),
                     "overload" if r.aborted else fmt(r.e2e_p99_s), str(r.num_preemptions)])
    print_table(f"herd: {args.policy} at {args.rate}/s on {args.instances} instances, each "
                f"decision {args.decision_ms} ms", ["routers", "TTFT p50 s", "TTFT p99 s",
                                                    "e2e p99 s", "preemptions"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA_DIR)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("cost")
    p.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    p.add_argument("--policies", nargs="+",
                   default=["block_slo", "po4_block_slo", "po2_block_slo", "llumnix"])
    p.add_argument("--decisions", type=int, default=200)
    p.add_argument("--quiet-load", type=float, default=1.5,
                   help="wait for the 1-minute load average to fall below this")
    p.set_defaults(run=cost)
    p = sub.add_parser("capacity")
    p.add_argument("--instances", type=int, default=100)
    p.add_argument("--policies", nargs="+", default=["block_slo", "po4_block_slo"])
    p.add_argument("--rates", default="400:480:20", help="LO:HI:STEP")
    p.add_argument("--num-requests", type=int, default=20000)
    p.set_defaults(run=capacity)
    p = sub.add_parser("herd")
    p.add_argument("--instances", type=int, default=100)
    p.add_argument("--policy", default="po4_block_slo")
    p.add_argument("--rate", type=float, default=400.0)
    p.add_argument("--routers", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--decision-ms", type=float, default=2.0)
    p.add_argument("--num-requests", type=int, default=20000)
    p.set_defaults(run=herd)
    args = parser.parse_args()
    if args.command != "cost":  # deterministic simulations: the load changes only wall time
        quiet.print_load_average("start")
    args.run(args)
    if args.command != "cost":
        quiet.print_load_average("end")


if __name__ == "__main__":
    main()
