"""Issue 41's targets for a plan `blockq plan --json` wrote: its cost against the cheapest
single-kind fleet and the routing-blind plan (both checked in the same simulation, from the
plan's alternatives), its tightness (the plan less any one GPU, replayed: some target must be
missed) and the datasheet derivation's step-time error. Deterministic simulation figures.

Usage::

    python scripts/check_plan.py --plan plan.json --workload FILE [--catalog FILE]
        [--model-map SERVED=FAMILY ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from domain.settings import Settings
from workers.plan import PlanOptions, derivation_error, load_catalog, parse_workload
from workers.plan.replay import tightness


def targets_table(plan: dict, tight: list[dict], derivation: dict[str, float]) -> list[str]:
    """Markdown rows of the targets table."""
    cost = plan["cost_per_hour"]
    singles = [a for a in plan["alternatives"]
               if a["name"].startswith("single:") and a["meets_targets"]]
    cheapest = min(singles, key=lambda a: a["cost_per_hour"]) if singles else None
    blind = next(a for a in plan["alternatives"] if a["name"] == "routing_blind")
    rows = ["| target | figure | met |", "|---|---|---|"]
    if cheapest:
        saving = 1 - cost / cheapest["cost_per_hour"]
        rows.append(f"| cost vs the cheapest single-kind fleet ({cheapest['name']}, "
                    f"{cheapest['cost_per_hour']:.2f}/h) | {cost:.2f}/h, {saving:.1%} lower | "
                    f"{'yes' if saving >= 0.20 else 'no'} (>= 20 %) |")
    else:
        rows.append(f"| cost vs the cheapest single-kind fleet | no single kind meets every "
                    f"target; the plan {cost:.2f}/h | yes |")
    blind_cost = blind["cost_per_hour"]
    if blind["meets_targets"]:
        saving = 1 - cost / blind_cost
        rows.append(f"| cost vs the routing-blind plan ({blind_cost:.2f}/h, meets the targets) | "
                    f"{saving:.1%} lower | {'yes' if saving >= 0.10 else 'no'} (>= 10 %) |")
    else:
        missed = [m for m, f in blind["models"].items() if not f["meets_targets"]]
        rows.append(f"| cost vs the routing-blind plan ({blind_cost:.2f}/h) | the blind plan "
                    f"misses {', '.join(missed)}'s targets in the simulation | yes |")
    failing = sum(not row["meets_targets"] for row in tight)
    rows.append(f"| tightness: the plan less any one GPU | {failing} of {len(tight)} smaller "
                f"fleets miss a target | {'yes' if failing == len(tight) else 'no'} |")
    rows.append(f"| derived A100 / H100 vs profiled, median step-time error | "
                f"{derivation['a100']:.1%} / {derivation['h100']:.1%} | "
                f"{'yes' if max(derivation.values()) <= 0.10 else 'no'} (<= 10 %) |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", type=Path, required=True)
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--catalog", type=Path)
    parser.add_argument("--model-map", nargs="+", default=[], metavar="SERVED=FAMILY")
    parser.add_argument("--json", type=Path, help="write the tightness rows and table here")
    args = parser.parse_args()
    plan = json.loads(args.plan.read_text())
    with args.workload.open() as lines:
        workload = parse_workload(lines, source=str(args.workload))
    catalog = load_catalog(args.catalog) if args.catalog else load_catalog()
    settings = Settings.load()
    options = PlanOptions(single_policy=settings.routing_policy_for(mixed_hardware=False),
                          mixed_policy=settings.routing_policy_for(mixed_hardware=True),
                          publish_interval_s=settings.state_publish_interval_s)
    tight = tightness(plan, workload, catalog, options,
                      dict(item.split("=", 1) for item in args.model_map))
    print("| fleet without one GPU | TTFT p99 s | e2e p99 s | meets its targets |")
    print("|---|---|---|---|")
    for row in tight:
        print(f"| {row['without']} | {row['ttft_p99_s']} | {row['e2e_p99_s']} | "
              f"{'yes' if row['meets_targets'] else 'no'} |")
    print()
    derivation = {t: derivation_error("llama-2-7b", "a30", t)["median"] for t in ("a100", "h100")}
    table = targets_table(plan, tight, derivation)
    print("\n".join(table))
    if args.json:
        args.json.write_text(json.dumps({"tightness": tight, "table": table}, indent=2) + "\n")


if __name__ == "__main__":
    main()
