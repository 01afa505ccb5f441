"""Chaos benchmark: the real stack under a mixed load while its parts are killed, then checked.

Starts its own PostgreSQL (initdb into a temporary directory) and its own Redis, each on a free
port of 127.0.0.1, so that killing them disturbs nothing else on the machine; runs the
migrations; starts the real blockq stack on them (`app.cli.stack.Stack`, emulated engines in
scaled time, no Flower) and sends a mixed job: native requests with webhooks to a receiver that
fails the first attempts of each event, OpenAI-compatible chat and text completions (streamed
and not, with the `openai` client), and two teams' batches. Meanwhile faults hit at random
times (seeded): SIGKILL and SIGTERM of every process kind, SIGSTOP of an engine beyond the
heartbeat TTL, Redis killed and restarted empty, PostgreSQL restarted (immediate) and its
connections terminated, and the crash-after-commit fault point. When the faults stop and the
system settles, it checks the delivery guarantees from PostgreSQL, the webhook receiver, the
clients' records and Redis, and prints what it found (docs/chaos.md says what each line means).

    .venv/bin/python scripts/chaos.py --requests 5000 --faults-per-kind 20 --json chaos.json
    .venv/bin/python scripts/chaos.py --requests 300 --faults-per-kind 1 \\
        --kinds sigkill:route,redis:restart-empty

Exit status 0 when every invariant holds, 1 otherwise. This file is the command line; the
harness is the package `benchmarks.chaos` (one module per part: services, receiver, workload,
faults, checks, recovery, run, report...). tests/stack/test_chaos.py runs a short run through
`benchmarks.chaos.run.run()`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from benchmarks.chaos.config import RunConfig
from benchmarks.chaos.faults import fault_kinds
from benchmarks.chaos.report import report
from benchmarks.chaos.resources import plot_resources
from benchmarks.chaos.run import RunResult, run
from domain.settings import Settings

__all__ = ["RunConfig", "RunResult", "run", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--faults-per-kind", type=int, default=20)
    parser.add_argument("--kinds", help="comma-separated fault kinds (default: all; "
                        "`--list-kinds` shows them)")
    parser.add_argument("--list-kinds", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--clients", type=int, default=48, help="client threads")
    parser.add_argument("--duration", type=float, help="seconds of traffic (default: "
                        "faults x --seconds-per-fault)")
    parser.add_argument("--seconds-per-fault", type=float, default=4.0)
    parser.add_argument("--crash-after-commit", type=float, default=0.002,
                        help="probability per commit of the crash-after-commit fault point "
                        "(0: not armed)")
    parser.add_argument("--webhook-fail-first", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=0.5,
                        help="wall seconds per emulated second of the engines")
    parser.add_argument("--settle-timeout", type=float, default=300.0)
    parser.add_argument("--recover-timeout", type=float, default=60.0)
    parser.add_argument("--model-path", type=Path)
    parser.add_argument("--work-dir", type=Path, help="keep everything here (default: a "
                        "temporary directory, removed after)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--json", type=Path, help="write the result as JSON here")
    parser.add_argument("--autoscale", action="store_true",
                        help="an autoscaled fleet (--instances at start, 1 to --max-instances) "
                        "with the scale fault kinds")
    parser.add_argument("--max-instances", type=int, default=4)
    parser.add_argument("--start-s", type=float, default=4.0,
                        help="emulated cold start of each instance (autoscaled)")
    parser.add_argument("--scale-down-after", type=float, default=10.0,
                        help="seconds an instance must be surplus before the autoscaler "
                        "drains it (autoscaled)")
    parser.add_argument("--sample-resources", type=float, metavar="S",
                        help="the soak: sample every process's memory and descriptors and the "
                        "services' sizes every S seconds, and report their growth")
    parser.add_argument("--resources-plot", type=Path, help="with --sample-resources: draw "
                        "them over the run into this PNG")
    args = parser.parse_args(argv)
    config = RunConfig.of_args(args)
    if args.list_kinds:
        settings = Settings(num_instances=args.instances, engine_kind="emulated",
                            autoscale=args.autoscale)
        print("\n".join(fault_kinds(settings)))
        return 0
    console = Console(width=200)
    result = run(config, log=lambda message: console.log(message))
    report(result, console)
    if args.resources_plot and result.resources:
        plot_resources(result.resources, [f["start"] for f in result.faults],
                       args.resources_plot)
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=1, default=str))
    return 1 if result.violations() else 0


if __name__ == "__main__":
    sys.exit(main())
