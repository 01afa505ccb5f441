"""The multi-host rig: blockq across hosts made of network namespaces, under host-level faults.

Makes a data host (its own PostgreSQL and Redis), two control hosts (API, predict, route, health,
batches, webhooks on both, beat on the first), three engine hosts (one emulated instance each,
and on the third a real vLLM instance on the tiny model too, unless --no-vllm), a balancer
host (HAProxy over the two APIs) and a client host (the load and the webhook receiver), each
a network namespace with its own hostname and data directory, on one bridge. During a mixed
job (benchmarks.chaos.workload) it kills an engine host and a control host outright, cuts an
engine host off from the data host for --partition-s, restarts Redis, and restarts the second
control host with its wall clock --clock-skew-s ahead. Then it settles and runs the chaos
run's checks.

    nice -n 5 .venv/bin/python scripts/multihost.py --requests 300 --broker redis

Needs root (namespaces, veth, iptables) and haproxy. The last line printed is one JSON
object: requests, lost, completed_twice, missing_webhooks, not_terminal, violations, recovery per
fault kind. Exit status 0 when every invariant holds. The package `benchmarks.multihost` is the
rig; docs/multihost.md says what it checks.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from app.cli.stack import stop_stacks_on_sigterm
from benchmarks.multihost.faults import KINDS
from benchmarks.multihost.run import RigConfig, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = RigConfig()
    parser.add_argument("--requests", type=int, default=defaults.requests)
    parser.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"comma-separated fault kinds, in order (default: {','.join(KINDS)})")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--clients", type=int, default=defaults.clients)
    parser.add_argument("--duration", type=float, help="seconds of traffic (default: long "
                        "enough for the faults)")
    parser.add_argument("--down-s", type=float, default=defaults.down_s)
    parser.add_argument("--partition-s", type=float, default=defaults.partition_s)
    parser.add_argument("--clock-skew-s", type=float, default=defaults.clock_skew_s,
                        help="how far ahead the clock-skew fault sets a host's wall clock "
                        "(negative: behind)")
    parser.add_argument("--time-scale", type=float, default=defaults.time_scale)
    parser.add_argument("--settle-timeout", type=float, default=defaults.settle_timeout_s)
    parser.add_argument("--model-path", type=Path)
    parser.add_argument("--vllm", action=argparse.BooleanOptionalAction, default=defaults.vllm,
                        help="run a real vLLM engine on the tiny model on eng-3 beside its "
                        "emulated one (default: on)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    config = RigConfig(
        requests=args.requests, broker=args.broker,
        kinds=[k for k in args.kinds.split(",") if k], seed=args.seed, clients=args.clients,
        duration_s=args.duration, down_s=args.down_s, partition_s=args.partition_s,
        clock_skew_s=args.clock_skew_s,
        time_scale=args.time_scale, settle_timeout_s=args.settle_timeout,
        model_path=args.model_path, vllm=args.vllm, keep=args.keep)
    stop_stacks_on_sigterm()
    console = Console(width=200, stderr=True)
    result = run(config, log=lambda message: console.log(message))
    print(json.dumps(result, default=str))
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
