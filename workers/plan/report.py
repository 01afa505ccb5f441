"""A plan as `blockq plan` writes it: the JSON scripts and checks rely on, and the fleet as a
`BLOCKQ_FLEET` that `blockq serve` runs (`workers.sim.fleet_declaration`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workers.sim import ExecModel, bundled_model_names

from .catalog import Catalog
from .search import Alternative, FleetPlan, PoolResult, Targets

__all__ = ["derived_models", "fleet_entries", "plan_json"]


def _figure(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None


def _pool_fleet(plan: FleetPlan, pool: PoolResult, catalog: Catalog) -> list[dict[str, Any]]:
    entries = []
    for kind, count in pool.mix:
        km = plan.kind_models[(pool.model, kind)]
        entries.append({
            "model": pool.model, "count": count, "gpu_kind": kind,
            "exec_model": km.exec_model_name, "derived": km.derived,
            "price_per_hour": catalog.kind(kind).price_per_hour,
            "num_blocks": km.config.num_total_blocks, "max_num_seqs": km.config.max_num_seqs,
            "capacity_rps": round(plan.saturated_rps[(pool.model, kind)], 4)})
    return entries


def _pool_figures(pool: PoolResult | None) -> dict[str, Any]:
    if pool is None:
        return {"ttft_p99_s": None, "e2e_p99_s": None, "meets_targets": False}
    return {"ttft_p99_s": _figure(pool.ttft_p99_s), "e2e_p99_s": _figure(pool.e2e_p99_s),
            "meets_targets": pool.meets, "requests": pool.num_requests, "policy": pool.policy}


def _alternative(plan: FleetPlan, alternative: Alternative, catalog: Catalog) -> dict[str, Any]:
    fleet = [entry for pool in alternative.pools.values() if pool is not None
             for entry in _pool_fleet(plan, pool, catalog)]
    return {"name": alternative.name, "fleet": fleet,
            "cost_per_hour": round(alternative.cost_per_hour, 4),
            "meets_targets": alternative.meets_targets,
            "models": {m: _pool_figures(p) for m, p in alternative.pools.items()}}


def plan_json(plan: FleetPlan, catalog: Catalog, targets: Mapping[str, Targets]
              ) -> dict[str, Any]:
    """``{"fleet", "cost_per_hour", "models", "headroom", "alternatives", ...}`` (issue 41's
    shape; the extra keys say what the figures were judged on)."""
    models = {}
    for model, pool in plan.pools.items():
        figures = _pool_figures(pool)
        figures["targets"] = {"ttft_p99_s": targets[model].ttft_p99_s,
                              "e2e_p99_s": targets[model].e2e_p99_s}
        figures["headroom"] = plan.headroom_by_model[model]
        models[model] = figures
    return {
        "fleet": [e for pool in plan.pools.values() for e in _pool_fleet(plan, pool, catalog)],
        "cost_per_hour": round(plan.cost_per_hour, 4),
        "models": models,
        "headroom": plan.headroom,
        "alternatives": [_alternative(plan, a, catalog) for a in plan.alternatives],
        "rate_scale": plan.rate_scale,
        "simulations": plan.num_simulations,
        "notes": list(plan.notes),
    }


def fleet_entries(plan: FleetPlan, models_dir: Path | None = None) -> list[dict[str, Any]]:
    """The planned fleet as `BLOCKQ_FLEET` entries, emulated: each kind's execution-time model,
    its KV blocks, batch size and measured capacity (what capacity-weighted routing weighs it
    by), and its catalog kind.

    A kind whose step times were derived from its datasheet has no bundled model: with
    `models_dir`, its entry names its model file there (`derived_models` gives what to write),
    so that the emulated engine and the router price its steps as the planner did; without,
    it leaves `exec_model` out (the configured default runs it).
    """
    bundled = set(bundled_model_names())
    entries = []
    for pool in plan.pools.values():
        for kind, count in pool.mix:
            km = plan.kind_models[(pool.model, kind)]
            entry: dict[str, Any] = {"model": pool.model, "count": count, "gpu_kind": kind,
                                     "engine": "emulated"}
            if km.exec_model_name in bundled:
                entry["exec_model"] = km.exec_model_name
            elif models_dir is not None:
                entry["exec_model"] = str(models_dir / f"{km.exec_model_name}.json")
            entry.update(num_blocks=km.config.num_total_blocks,
                         max_num_seqs=km.config.max_num_seqs,
                         capacity_rps=round(plan.saturated_rps[(pool.model, kind)], 4))
            entries.append(entry)
    return entries


def derived_models(plan: FleetPlan) -> dict[str, ExecModel]:
    """The planned fleet's derived execution-time models by file name (`fleet_entries`)."""
    bundled = set(bundled_model_names())
    return {f"{km.exec_model_name}.json": km.exec_model
            for pool in plan.pools.values() for kind, _ in pool.mix
            if (km := plan.kind_models[(pool.model, kind)]).exec_model_name not in bundled}
