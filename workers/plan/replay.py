"""Anyone can check a plan: a declared fleet (`BLOCKQ_FLEET`) replaying a workload file through
the same simulation the planner judged with (`search.run_pool`), each model's pool on its own
requests, under the production default policies (`scripts/bench_cluster.py --workload-file`).

An instance's step times and vLLM settings come from its `gpu_kind` in the catalog when it has
one (as the planner built them: bundled where profiled, else from the datasheet), else from its
bundled `exec_model`; its own `num_blocks` and `max_num_seqs` override either.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from workers.cluster_sim import FleetMember, saturation_rate
from workers.sim import exec_model_of
from workers.sim.fleet_declaration import InstanceSpec
from workers.sim.hardware import instance_config

from .catalog import Catalog
from .derive import kind_model
from .search import PlanOptions, run_pool
from .workload import PlanInputError, PlanWorkload

__all__ = ["less_one_gpu", "replay_fleet", "tightness"]


def _member(spec: InstanceSpec, family: str, catalog: Catalog) -> tuple[str, FleetMember]:
    """The instance's kind label and its simulated member."""
    if spec.gpu_kind is not None:
        km = kind_model(family, catalog.kind(spec.gpu_kind))
        label, config, model = spec.gpu_kind, km.config, km.exec_model
    elif spec.exec_model is not None:
        label, config, model = (spec.exec_model, instance_config(spec.exec_model),
                                exec_model_of(spec.exec_model))
    else:
        raise PlanInputError(f"fleet instance of model {spec.model!r} names neither gpu_kind "
                             "nor exec_model: the simulation cannot price its steps")
    sized = {field: value for field, value in (("num_total_blocks", spec.num_blocks),
                                               ("max_num_seqs", spec.max_num_seqs))
             if value is not None}
    return label, FleetMember(replace(config, **sized) if sized else config, model)


def replay_fleet(specs: Sequence[InstanceSpec], workload: PlanWorkload, catalog: Catalog,
                 options: PlanOptions | None = None, rate_scale: float = 1.0,
                 family_of: Mapping[str, str] | None = None,
                 abort_ttft_s: Mapping[str, float] | None = None) -> dict[str, Any]:
    """``{"models": {MODEL: {"ttft_p99_s", "e2e_p99_s", "requests", ...}}}`` for every model of
    `workload`. Raises `PlanInputError` naming a model the fleet does not serve.

    `abort_ttft_s`: per model, give a run up once 1 % of its requests waited this long for a
    first token (its figures are then None: over that)."""
    options = options or PlanOptions()
    family_of = dict(family_of or {})
    models: dict[str, Any] = {}
    for model in workload.models:
        pool = [s for s in specs if s.model == model]
        if not pool:
            raise PlanInputError(f"model {model!r} of the workload has no instance in the fleet "
                                 f"(it serves {sorted({s.model for s in specs})})")
        labelled = [_member(s, family_of.get(model, model), catalog) for s in pool]
        kinds = {label for label, _ in labelled}
        policy = options.mixed_policy if len(kinds) > 1 else options.single_policy
        sample = workload.by_model[model].head(options.saturation_requests)
        saturated: dict[str, float] = {}
        members = []
        for label, member in labelled:  # told their capacity, as the planner tells them
            if label not in saturated:
                saturated[label] = saturation_rate(sample, member.config, member.exec_model)
            members.append(replace(member, throughput_rps=saturated[label]))
        run, num_requests = run_pool(workload.by_model[model],
                                     workload.rate_by_model[model] * rate_scale, members, policy,
                                     options, (abort_ttft_s or {}).get(model))
        models[model] = {"ttft_p99_s": _figure(run.ttft_p99_s),
                         "e2e_p99_s": _figure(run.e2e_p99_s), "requests": num_requests,
                         "instances": len(members), "policy": policy,
                         "rate_rps": round(workload.rate_by_model[model] * rate_scale, 4)}
    return {"models": models}


def _figure(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None


def less_one_gpu(entries: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[dict]]]:
    """Every fleet one GPU smaller than `entries` (a plan's "fleet"): (label, entries) for each
    entry with its count less one (an entry of one is left out)."""
    fleets = []
    for index, entry in enumerate(entries):
        smaller = [dict(e) for e in entries]
        smaller[index]["count"] -= 1
        fleets.append((f"{entry['model']}: {entry['count'] - 1} x {entry['gpu_kind']}",
                       [e for e in smaller if e["count"] > 0]))
    return fleets


def tightness(plan: Mapping[str, Any], workload: PlanWorkload, catalog: Catalog,
              options: PlanOptions | None = None, family_of: Mapping[str, str] | None = None
              ) -> list[dict[str, Any]]:
    """For each GPU of a plan (`plan_json`'s dict), the fleet without it replayed: its model's
    figures (None: given up, over twice a target) and whether that model still meets its
    targets (a tight plan: never)."""
    rows = []
    targets = {m: f["targets"] for m, f in plan["models"].items()}
    for label, entries in less_one_gpu(plan["fleet"]):
        model = label.split(":")[0]
        specs = [InstanceSpec.model_validate({k: e[k] for k in ("model", "count", "gpu_kind")})
                 for e in entries if e["model"] == model]
        only = PlanWorkload({model: workload.by_model[model]},
                            {model: workload.rate_by_model[model]}, workload.span_s)
        if not specs:
            rows.append({"without": label, "model": model, "meets_targets": False,
                         "ttft_p99_s": None, "e2e_p99_s": None})
            continue
        goal = targets[model]
        # A run over twice a target's latency for its first tokens has missed: given up there.
        limit = 2 * max(t for t in goal.values() if t is not None)
        figures = replay_fleet(specs, only, catalog, options, plan.get("rate_scale", 1.0),
                               family_of, {model: limit})["models"][model]
        meets = all(figures[key] is not None and figures[key] <= goal[key]
                    for key in ("ttft_p99_s", "e2e_p99_s") if goal[key] is not None)
        rows.append({"without": label, "model": model, "meets_targets": meets,
                     "ttft_p99_s": figures["ttft_p99_s"], "e2e_p99_s": figures["e2e_p99_s"]})
    return rows
