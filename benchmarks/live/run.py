"""Live routing benchmark: the real stack in front of emulated instances, a workload replayed
through the API, latency per policy and the capacity at a TTFT p99 SLO (scripts/bench_live.py:
usage and method).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from app.cli.stack import stop_stacks_on_sigterm
from benchmarks import quiet
from benchmarks.cluster import NUM_BLOCKS  # each emulated GPU's KV blocks, as simulated
from benchmarks.live import models, workloads
from benchmarks.live.point import POLICIES, PointSpec, run_point
from benchmarks.live.report import fmt, plot, print_report, versus_simulated_points
from benchmarks.live.stats import rates_around_simulated, search_capacity
from benchmarks.paths import ROOT

WORKLOADS = ("conversations", "sharegpt-azure", "mooncake")
DEFAULT_RATES = (30.0, 40.0, 50.0, 60.0, 70.0)
SMOKE = {"instances": 4, "requests": 100, "policies": ["round_robin", "block"], "rates": [12.0],
         "bisect": 0, "workloads": ["conversations"], "time_scale": 4.0}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="4 instances, 100 requests, round_robin and block, one rate")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS[:2]),
                        help="mooncake (issue 15: shared prefixes, the engines' prefix cache) "
                             "is run only when named")
    parser.add_argument("--policies", nargs="+", choices=list(POLICIES),
                        default=[p for p in POLICIES if p not in ("prefix_affinity", "default")],
                        help="default: all but prefix_affinity (issue 15's baseline) and "
                             "default (the production default policy, unset)")
    parser.add_argument("--rates", type=float, nargs="+", default=list(DEFAULT_RATES),
                        help="emulated requests/s, tried in order until the SLO fails")
    parser.add_argument("--around-sim", type=Path, metavar="JSON",
                        help="per policy, try the rates --spread around the capacity that "
                             "`bench_cluster.py --live-settings --json` found for the same "
                             "workload, request count and seed (instead of --rates; a policy "
                             "the file lacks falls back to --rates)")
    parser.add_argument("--spread", type=float, default=0.1,
                        help="with --around-sim: try capacity x (1 -/+ spread)")
    parser.add_argument("--bisect", type=int, default=2,
                        help="bisection steps between the last passing and first failing rate")
    parser.add_argument("--slo", type=float, default=3.0, help="TTFT p99 SLO, emulated s")
    parser.add_argument("--instances", type=int, default=12)
    parser.add_argument("--fleet", help="a fleet of unlike emulated instances in the "
                                        "BLOCKQ_FLEET JSON format (each entry's exec_model its "
                                        "hardware), instead of --instances x --exec-model")
    parser.add_argument("--model-share", nargs="+", default=[], metavar="MODEL=SHARE",
                        help="with a --fleet of several models: each request names one, drawn "
                             "with --seed by these shares (e.g. llama-2-7b=0.75 "
                             "llama-3-8b=0.25); required there")
    parser.add_argument("--quiet-load", type=float, default=1.0,
                        help="wait for the 1-minute load average to fall below this first")
    parser.add_argument("--exec-model", choices=tuple(NUM_BLOCKS), default="qwen2-7b-a30",
                        help="the emulated GPU: llama-2-7b-a30 has 1052 KV blocks (memory-bound, "
                             "where placement matters most), qwen2-7b-a30 7289")
    parser.add_argument("--requests", type=int, default=2000, help="requests per point")
    parser.add_argument("--time-scale", type=float, default=8.0,
                        help="wall seconds per emulated second (>1: slow motion)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workload-dir", type=Path, default=ROOT / ".blockq" / "live_workload")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--model-path", type=Path, default=ROOT / ".blockq" / "models" /
                        "tiny-llama", help="served model directory (its tokenizer counts)")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--bias-watch", action="store_true",
                        help="keep the bias watch's fallback and correction as shipped "
                             "(default: off, see docs/benchmarks_live.md)")
    parser.add_argument("--database-url",
                        default="postgresql+psycopg://postgres@127.0.0.1:5432/blockq_bench_live",
                        help="dropped and created again for every point")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13",
                        help="flushed for every point")
    parser.add_argument("--api-port", type=int, default=8811)
    parser.add_argument("--flower-port", type=int, default=5611)
    parser.add_argument("--no-early-stop", dest="early_stop", action="store_false",
                        help="run a point to its end even once its TTFT p99 is certain to "
                             "exceed the SLO (default: stop it there, saving the failing points)")
    parser.add_argument("--drain-timeout", type=float, default=900.0,
                        help="wall s to wait for the last requests after the last arrival")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    parser.add_argument("--replot", type=Path, help="tables and plots from a --json file")
    parser.add_argument("--sim-points", type=Path, metavar="JSON",
                        help="with --replot: each live point beside the same policy and rate in "
                             "this `bench_cluster.py --json` file")
    parser.add_argument("--plot-dir", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args(argv)
    try:
        args.model_shares = models.parse_model_shares(args.model_share)
    except ValueError as error:
        parser.error(str(error))
    if args.fleet or args.model_shares:
        from workers.sim.fleet_declaration import parse_fleet  # noqa: PLC0415

        served = models.fleet_models(parse_fleet(args.fleet)) if args.fleet else []
        if (len(served) > 1 or args.model_shares) and set(served) != set(args.model_shares):
            parser.error(f"--model-share must name exactly the fleet's models {served}, "
                         f"got {list(args.model_shares)}")
    if args.smoke:
        for name, value in SMOKE.items():
            if parser.get_default(name) == getattr(args, name):
                setattr(args, name, value)
    return args


def _load_workload(name: str, args: argparse.Namespace) -> workloads.LiveWorkload:
    from domain.prompts import PromptCodec  # noqa: PLC0415 - loads transformers

    codec = PromptCodec(args.model_path)
    if name == "conversations":
        if not (args.workload_dir / "requests.jsonl").exists():
            raise SystemExit(f"{args.workload_dir}/requests.jsonl missing: run "
                             "scripts/make_live_workload.py first")
        return workloads.conversations(args.workload_dir, num_requests=args.requests,
                                       max_model_len=args.max_model_len, seed=args.seed,
                                       count_tokens=codec.count)
    # block's lengths on ShareGPT (no prompt text to run the model on): the learned-errors
    # noise model, the shipped model's measured held-out residuals by true length, drawn with
    # the run's seed as the discrete-event benchmark draws them.
    from workers.cluster_sim.predictors import load_length_errors  # noqa: PLC0415

    try:
        errors = load_length_errors()
    except FileNotFoundError:  # the fixture (scripts/make_length_error_fixture.py) not made yet
        errors = None
    build = workloads.mooncake if name == "mooncake" else workloads.sharegpt_azure
    return build(
        args.data, num_requests=args.requests, max_model_len=args.max_model_len, seed=args.seed,
        decode=codec.decode, vocab_size=codec.vocab_size,
        learned=None if errors is None else (lambda true: errors.draw(true, args.seed)))


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    stop_stacks_on_sigterm()
    # Wide tables stay readable when the output goes to a file.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    if args.replot:
        raw = json.loads(args.replot.read_text())
        print_report(raw, console)
        if args.sim_points:
            console.print(versus_simulated_points(raw, json.loads(args.sim_points.read_text())))
        for path in plot(raw, args.plot_dir, prefix="live_smoke" if raw.get("smoke") else "live"):
            console.print(f"plot: {path}")
        return 0
    with quiet.measurement():
        load = quiet.wait_for_quiet(args.quiet_load)
        raw = _measure(args, console, load)
    print_report(raw, console)
    for path in plot(raw, args.plot_dir, prefix="live_smoke" if args.smoke else "live"):
        console.print(f"plot: {path}")
    return 0


def _measure(args: argparse.Namespace, console: Console,
             load: tuple[float, float, float]) -> dict[str, Any]:
    """Every (workload, policy) capacity search; the raw results, saved after each point."""
    raw: dict[str, Any] = {
        "smoke": args.smoke, "slo_s": args.slo, "workloads": args.workloads,
        "policies": args.policies, "time_scale": args.time_scale, "instances": args.instances,
        "exec_model": args.exec_model, "fleet": args.fleet,
        "fleet_label": _fleet_label(args.fleet) if args.fleet else None,
        "requests": args.requests, "seed": args.seed, "bias_watch": args.bias_watch,
        "model_shares": args.model_shares or None,
        "early_stop": args.early_stop,
        "command": " ".join(sys.argv), "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                    time.gmtime()),
        "loadavg_start": load, "points": [], "capacity": {},
    }

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps(raw, default=_json_default) + "\n")

    simulated = (json.loads(args.around_sim.read_text())["summary"] if args.around_sim
                 else None)
    raw["simulated"] = simulated
    for name in args.workloads:
        workload = _load_workload(name, args)
        if args.model_shares:
            workload = models.assign_models(workload, args.model_shares, args.seed)
        fleet = _declared_fleet(args, workload) if args.fleet else None
        console.print(f"[bold]{name}[/bold]: {len(workload.requests)} requests, mean output "
                      f"{workload.mean_output_tokens:.0f} tokens, serving model "
                      f"{workload.serving_model!r}; " + "; ".join(workload.notes))
        if fleet is not None:
            console.print(f"fleet: {fleet}")
        for policy in args.policies:
            if POLICIES[policy][1] == "learned" and not workload.learned_live and any(
                    r.learned_tokens is None for r in workload.requests):
                console.print(f"[yellow]{policy}: skipped, no learned predictions for "
                              f"{name}[/yellow]")
                continue

            def measure(rate: float, policy: str = policy,
                        workload: workloads.LiveWorkload = workload,
                        fleet: str | None = fleet) -> float:
                console.print(f"{workload.name} / {policy} @ {rate:g} req/s (emulated)")
                started = time.time()
                point = run_point(PointSpec(
                    workload, policy, rate, args.time_scale,
                    len(json.loads(fleet)) if fleet else args.instances, args.database_url,
                    args.redis_url, args.model_path, args.api_port, args.flower_port,
                    args.max_model_len, args.drain_timeout, args.bias_watch,
                    stop_above_slo_s=args.slo if args.early_stop else None,
                    exec_model=args.exec_model, num_blocks=NUM_BLOCKS[args.exec_model],
                    fleet=fleet),
                    log=console.print)
                point["wall"]["point_s"] = time.time() - started
                raw["points"].append(point)
                save()
                ttft, e2e = point["ttft_s"], point["e2e_s"]
                console.print(
                    f"  TTFT p50/p99 {fmt(ttft['p50'], 3)}/{fmt(ttft['p99'], 3)} s, "
                    f"e2e p50/p99 {fmt(e2e['p50'])}/{fmt(e2e['p99'])} s (emulated); "
                    f"{point['finished']}/{point['requests']} finished"
                    f"{'; stopped: p99 certainly above the SLO' if point['stopped_early'] else ''}"
                    f"; load {point['load']['loadavg_1m_mean']:.1f}; "
                    f"{point['wall']['point_s']:.0f} s")
                p99 = point["ttft_s"]["p99"]
                return math.inf if math.isnan(p99) else p99

            rates = args.rates
            if simulated is not None:
                rates = rates_around_simulated(
                    simulated, workload=name, policy=policy, num_requests=args.requests,
                    seed=args.seed, spread=args.spread,
                    model=raw["fleet_label"] or args.exec_model) or rates
            result = search_capacity(measure, rates, args.slo, bisect_steps=args.bisect)
            if result.first_failing is None:
                console.print(
                    f"[yellow]{name} / {policy}: no rate failed the SLO, so the capacity is "
                    f"only known to be at least {max(rates):g} req/s; try higher rates, or more "
                    f"requests if the p99 does not grow with the rate (the fleet never "
                    f"filled)[/yellow]")
            raw["capacity"].setdefault(name, {})[policy] = {
                "capacity": result.capacity, "first_failing": result.first_failing}
            save()
    raw["loadavg_end"] = os.getloadavg()
    console.print(f"load average at the end: "
                  f"{' / '.join(f'{x:.2f}' for x in raw['loadavg_end'])}")
    save()
    return raw


def _declared_fleet(args: argparse.Namespace, workload: workloads.LiveWorkload) -> str:
    """`--fleet` as the stack runs it (BLOCKQ_FLEET JSON): every entry on an emulated engine
    (serving the workload's model, or with several models each its own: `models.stack_fleet`),
    sized as the discrete-event benchmark sizes it."""
    from workers.cluster_sim import Workload, declared_fleet  # noqa: PLC0415
    from workers.sim.fleet_declaration import parse_fleet  # noqa: PLC0415

    lengths = Workload(workload.name, tuple(float(i) for i in range(len(workload.requests))),
                       tuple(r.prompt_tokens for r in workload.requests),
                       tuple(r.output_tokens for r in workload.requests))
    specs = models.stack_fleet(parse_fleet(args.fleet), serving_model=workload.serving_model,
                               model_path=args.model_path)
    sized = declared_fleet(specs, lengths, max_model_len=args.max_model_len)
    # One model: the stack's model_path serves it (Settings.instances), so none is declared.
    keep_path = len(models.fleet_models(sized)) > 1
    return json.dumps([spec.model_dump(mode="json", exclude_none=True,
                                       exclude=None if keep_path else {"model_path"})
                       for spec in sized])


def _fleet_label(fleet: str) -> str:
    from workers.cluster_sim import fleet_label  # noqa: PLC0415
    from workers.sim.fleet_declaration import parse_fleet  # noqa: PLC0415

    return fleet_label(parse_fleet(fleet))


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON: {type(value)}")


if __name__ == "__main__":
    raise SystemExit(main())
