"""The fleet planner (`blockq plan`): the cheapest mix of GPU kinds for a workload and its
latency targets, each candidate fleet judged by the cluster simulation that runs blockq's own
routing decision. Pure: no Flask, Celery, database or Redis (the CLI reads the inputs).

Entry points: `parse_workload` / `workload_of` (the requests), `load_catalog` /
`parse_catalog` (the GPU kinds), `plan_fleet` (the search), `plan_json` and `fleet_entries`
(the answer as the CLI writes it).
"""

from .catalog import DEFAULT_CATALOG, Catalog, GpuKind, load_catalog, parse_catalog
from .derive import KindModel, derivation_error, derive_exec_model, kind_model
from .replay import replay_fleet
from .report import derived_models, fleet_entries, plan_json
from .search import FleetPlan, PlanOptions, PoolResult, Targets, lone_latency, plan_fleet
from .workload import PlanInputError, PlanRequest, PlanWorkload, parse_workload, workload_of

__all__ = [
    "DEFAULT_CATALOG",
    "Catalog",
    "FleetPlan",
    "GpuKind",
    "KindModel",
    "PlanInputError",
    "PlanOptions",
    "PlanRequest",
    "PlanWorkload",
    "PoolResult",
    "Targets",
    "derivation_error",
    "derive_exec_model",
    "derived_models",
    "fleet_entries",
    "kind_model",
    "load_catalog",
    "lone_latency",
    "parse_catalog",
    "parse_workload",
    "plan_fleet",
    "plan_json",
    "replay_fleet",
    "workload_of",
]
