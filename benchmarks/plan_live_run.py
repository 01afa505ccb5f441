"""The live proof of a plan: blockq plan's fleet as emulated instances through the real stack,
its workload replayed, each model's live p99s beside the planner's (scripts/bench_plan_live.py:
usage).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from app.cli.stack import stop_stacks_on_sigterm
from benchmarks import quiet
from benchmarks.live.point import PointSpec, run_point
from benchmarks.paths import ROOT
from benchmarks.plan_live import (
    PlanLiveError,
    compare_rows,
    instance_shares,
    plan_fleet_specs,
    plan_requests,
    plan_workload,
)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True, help="blockq plan's --json output")
    parser.add_argument("--workload", type=Path, required=True, help="the plan's workload file")
    parser.add_argument("--time-scale", type=float, default=4.0,
                        help="wall seconds per emulated second (>1: slow motion)")
    parser.add_argument("--seed", type=int, default=0,
                        help="prompt ids and the learned-errors draws (the planner's seed: 0)")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--model-path", type=Path, default=ROOT / ".blockq" / "models" /
                        "tiny-llama", help="served model directory (its tokenizer)")
    parser.add_argument("--quiet-load", type=float, default=1.0,
                        help="wait for the 1-minute load average to fall below this first")
    parser.add_argument("--database-url",
                        default="postgresql+psycopg://postgres@127.0.0.1:5432/blockq_bench_live",
                        help="dropped and created again")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13", help="flushed")
    parser.add_argument("--api-port", type=int, default=8811)
    parser.add_argument("--flower-port", type=int, default=5611)
    parser.add_argument("--drain-timeout", type=float, default=900.0,
                        help="wall s to wait for the last requests after the last arrival")
    parser.add_argument("--bias-watch", action="store_true",
                        help="keep the bias watch's fallback and correction as shipped "
                             "(default: off, as the planner's simulation has none)")
    parser.add_argument("--json", type=Path, help="write the raw result here")
    args = parser.parse_args(argv)
    if args.time_scale <= 0:
        parser.error(f"--time-scale must be positive, got {args.time_scale}")
    return args


def _inputs(args: argparse.Namespace):
    """(plan, fleet JSON, workload); exits naming the problem on bad input."""
    try:
        plan = json.loads(args.plan.read_text())
        fleet = plan_fleet_specs(plan, model_path=args.model_path)
        requests = plan_requests(args.workload.read_text().splitlines(), str(args.workload))
    except (OSError, json.JSONDecodeError, PlanLiveError) as error:
        raise SystemExit(f"bench_plan_live: {error}") from None
    missing = sorted({r.model for r in requests} - {s.model for s in fleet})
    if missing:
        raise SystemExit(f"bench_plan_live: the plan's fleet serves no instance of {missing}")
    from domain.prompts import PromptCodec  # noqa: PLC0415 - loads transformers
    from workers.cluster_sim.predictors import load_length_errors  # noqa: PLC0415

    codec, errors = PromptCodec(args.model_path), load_length_errors()
    try:
        workload = plan_workload(requests, max_model_len=args.max_model_len, seed=args.seed,
                                 decode=codec.decode, vocab_size=codec.vocab_size,
                                 learned=lambda true: errors.draw(true, args.seed))
    except PlanLiveError as error:
        raise SystemExit(f"bench_plan_live: {error}") from None
    fleet_json = json.dumps([s.model_dump(mode="json", exclude_none=True) for s in fleet])
    return plan, fleet_json, workload


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    plan, fleet, workload = _inputs(args)
    stop_stacks_on_sigterm()
    console = Console() if sys.stdout.isatty() else Console(width=160)
    span = workload.unit_arrival_s[-1] or 1.0
    rate = len(workload.requests) / span
    console.print(f"plan: {plan.get('cost_per_hour')}/h; fleet {fleet}")
    console.print(f"{len(workload.requests)} requests over {span:.0f} emulated s ({rate:.2f}/s "
                  f"emulated, {rate / args.time_scale:.2f}/s wall at time scale "
                  f"{args.time_scale:g}: about {span * args.time_scale / 60:.0f} wall min of "
                  f"sending); " + "; ".join(workload.notes))
    instances = sum(entry["count"] for entry in json.loads(fleet))
    with quiet.measurement():
        load_start = quiet.wait_for_quiet(args.quiet_load)
        started = time.time()
        # rate 1: the file's arrival seconds are sent as they are, in emulated time
        point = run_point(PointSpec(
            workload, "default", 1.0, args.time_scale, instances, args.database_url,
            args.redis_url, args.model_path, args.api_port, args.flower_port,
            args.max_model_len, args.drain_timeout, bias_watch=args.bias_watch, fleet=fleet),
            log=console.print)
        load_end = quiet.print_load_average("end")
    rows = compare_rows(plan.get("models", {}), point["by_model"])
    console.print(_table(rows, args.time_scale))
    shares = instance_shares([r.model for r in workload.requests], point["samples"])
    console.print("requests per instance: " + "; ".join(
        f"{m}: " + ", ".join(f"{i} {n}" for i, n in per.items()) for m, per in shares.items()))
    console.print(f"{point['succeeded']}/{point['requests']} succeeded, {point['failed']} "
                  f"failed, {point['rerouted']} rerouted, {point['fallback_routed']} "
                  f"fallback-routed; predictors {point['predictors']}; client lag p99 "
                  f"{point['client']['lag_p99_ms']:.0f} ms; wall {time.time() - started:.0f} s")
    console.print(f"load average: start {quiet.format_load(load_start)}, end "
                  f"{quiet.format_load(load_end)}")
    if args.json:
        args.json.write_text(json.dumps({
            "command": " ".join(sys.argv), "plan": str(args.plan),
            "workload": str(args.workload), "time_scale": args.time_scale, "fleet": fleet,
            "loadavg_start": load_start, "loadavg_end": load_end, "comparison": rows,
            "point": point}, default=str) + "\n")
    return 0


def _table(rows: list[dict], time_scale: float) -> Table:
    table = Table(title=f"live (real stack, emulated instances, time scale {time_scale:g}) "
                        "against the plan's prediction, emulated s")
    for column in ("model", "requests", "TTFT p99 live", "predicted", "ratio",
                   "e2e p99 live", "predicted", "ratio", "accept->routed p99"):
        table.add_column(column, justify="left" if column == "model" else "right")

    def cell(value: float | None, digits: int = 3) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    for row in rows:
        t, e = row["ttft_p99_s"], row["e2e_p99_s"]
        table.add_row(row["model"], str(row["requests"]), cell(t["live"]), cell(t["predicted"]),
                      cell(t["ratio"], 2), cell(e["live"]), cell(e["predicted"]),
                      cell(e["ratio"], 2), cell(row["accept_to_routed_p99_s"]))
    return table


if __name__ == "__main__":
    raise SystemExit(main())
