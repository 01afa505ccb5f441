"""The wall time of `blockq plan` (issue 41's target: 60 s or less for 2 models, 3 GPU kinds and
10,000 requests on 2 cores), measured alone: the test services' lock and a quiet machine, the
load average printed at the start and the end.

Builds docs/planning.md's workload (`scripts/make_plan_workload.py`'s defaults) unless given one,
then times one `blockq plan` run in a child process (its worker processes included) and prints
the plan's cost and simulation count beside the wall time.

Usage::

    python scripts/bench_plan.py [--workload FILE] [--catalog FILE] [--quiet-load 1.5]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.paths import ROOT as REPO_ROOT
from benchmarks.quiet import alone

CATALOG = REPO_ROOT / "workers" / "plan" / "data" / "example_catalog.json"
SLOS = ("--slo", "llama-2-7b:ttft_p99=1", "--slo", "llama-3-8b:e2e_p99=4")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", type=Path, help="default: built from the shared traces")
    parser.add_argument("--catalog", type=Path, default=CATALOG)
    parser.add_argument("--quiet-load", type=float, default=1.5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        workload = args.workload or Path(folder) / "workload.jsonl"
        if args.workload is None:
            subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "make_plan_workload.py"),
                            "--out", str(workload)], check=True)
        out = Path(folder) / "plan.json"
        command = [str(Path(sys.executable).parent / "blockq"), "plan", "--workload",
                   str(workload), "--catalog", str(args.catalog), *SLOS, "--json", str(out)]
        with alone(args.quiet_load):
            started = time.perf_counter()
            done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
            wall_s = time.perf_counter() - started
        if done.returncode != 0:
            sys.exit(f"blockq plan failed:\n{done.stdout}\n{done.stderr}")
        plan = json.loads(out.read_text())
        requests = sum(1 for _ in workload.open())
    print("| requests | GPU kinds | wall s | simulations | plan per hour |")
    print("|---|---|---|---|---|")
    kinds = len(json.loads(args.catalog.read_text())["kinds"])
    print(f"| {requests} | {kinds} | {wall_s:.1f} | {plan['simulations']} | "
          f"{plan['cost_per_hour']:.2f} |")


if __name__ == "__main__":
    main()
