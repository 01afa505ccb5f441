"""The cluster benchmark's world: ground-truth instances, workloads, a routed fleet (pure).

Benchmark-only: production never imports it. It sits above the simulator (`workers.sim`, the
instances) and the route stage's pure policies (the router it simulates), which import
`workers.sim` themselves; inside `workers.sim` it would make the two packages a cycle.
"""

from .fleet_setup import declared_fleet, fleet_label, fleet_members, with_equal_kv, with_throughputs
from .ground_truth import GroundTruthInstance, SimulatedRequest
from .predictors import (
    DEFAULT_PREDICTOR,
    SIMULATED_LENGTH_PREDICTORS,
    LengthPredictor,
    LogNormalPredictor,
    MeanPredictor,
    OraclePredictor,
    predictor_from_spec,
)
from .simulation import (
    ClusterSetup,
    FleetMember,
    RunResult,
    capacity_bounds,
    saturation_rate,
    simulate,
)
from .targets import LatencyTarget, TargetMix, draw_targets, met
from .workload import (
    AZURE_CODE,
    AZURE_CONV,
    MOONCAKE_CONV,
    SHAREGPT,
    ReplayPrompt,
    Workload,
    fit_to_model,
    load_azure_trace,
    load_length_trace,
    load_mooncake_trace,
    load_replay_prompts,
    load_sharegpt_azure,
    multi_turn_workload,
    poisson_unit_arrivals,
    replay_sequence,
    replay_workload,
    shared_prompt_workload,
)

__all__ = [
    "LatencyTarget",
    "TargetMix",
    "draw_targets",
    "met",
    "AZURE_CODE",
    "AZURE_CONV",
    "DEFAULT_PREDICTOR",
    "SIMULATED_LENGTH_PREDICTORS",
    "MOONCAKE_CONV",
    "SHAREGPT",
    "ClusterSetup",
    "FleetMember",
    "GroundTruthInstance",
    "LengthPredictor",
    "LogNormalPredictor",
    "MeanPredictor",
    "OraclePredictor",
    "ReplayPrompt",
    "RunResult",
    "SimulatedRequest",
    "Workload",
    "capacity_bounds",
    "fit_to_model",
    "fleet_label",
    "declared_fleet",
    "fleet_members",
    "load_azure_trace",
    "load_length_trace",
    "load_mooncake_trace",
    "multi_turn_workload",
    "shared_prompt_workload",
    "load_replay_prompts",
    "load_sharegpt_azure",
    "poisson_unit_arrivals",
    "predictor_from_spec",
    "replay_sequence",
    "replay_workload",
    "saturation_rate",
    "simulate",
    "with_equal_kv",
    "with_throughputs",
]
