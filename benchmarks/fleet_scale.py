"""Routing at internet scale, in simulation: what one decision costs as the fleet grows (full
fan-out against power-of-k what-ifs), what power-of-k gives up in capacity, and the herd effect
of several routers deciding side by side on the published state.

Every decision here is production's (`workers.route.pipeline.decide_route`); the fleets are
the cluster simulation's (`workers.cluster_sim`). Used by scripts/bench_fleet_scale.py.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from workers.cluster_sim import (
    SHAREGPT,
    ClusterSetup,
    FleetMember,
    RunResult,
    Workload,
    load_length_trace,
    poisson_unit_arrivals,
    predictor_from_spec,
    simulate,
)
from workers.cluster_sim.simulation import LedgerCandidate
from workers.route.pipeline import (
    DecisionContext,
    FleetRead,
    Routed,
    RouteRequest,
    RoutingRules,
    decide_route,
)
from workers.route.policies import FleetLedger, RequestView
from workers.sim import ExecModel, InstanceSnapshot, SimRequest, bundled_model
from workers.sim.hardware import instance_config

__all__ = ["MIXED_KINDS", "DecisionCost", "decision_cost", "mixed_fleet", "run_point",
           "sharegpt"]

#: (served model, execution-time model) pairs a synthetic large fleet draws its instances from:
#: several models on several GPU kinds.
MIXED_KINDS = (("llama-2-7b", "llama-2-7b-a30"), ("llama-2-7b", "llama-2-7b-a100"),
               ("llama-2-7b", "llama-2-7b-h100"), ("llama-3-8b", "llama-3-8b-a100"),
               ("qwen2-7b", "qwen2-7b-a30"))
MAX_MODEL_LEN = 4096


@dataclass(frozen=True, slots=True)
class DecisionCost:
    num_instances: int
    policy: str
    #: Median and 99th percentile wall time of one decision, microseconds.
    p50_us: float
    p99_us: float
    #: Candidates of the request's model (what the pipeline plans over).
    num_candidates: int


def decision_cost(num_instances: int, policy: str, *, num_decisions: int = 200,
                  seed: int = 0) -> DecisionCost:
    """Time `decide_route` on a fleet of `num_instances` unlike instances of several models,
    each with a random published load; every decision is noted (the next sees it)."""
    rng = random.Random(seed)
    ledger = FleetLedger()
    candidates: list[LedgerCandidate] = []
    models: dict[str, ExecModel] = {}
    for k in range(num_instances):
        served, kind = MIXED_KINDS[k % len(MIXED_KINDS)]
        instance_id = f"gpu.{k}"
        ledger.publish(instance_id, _loaded_snapshot(kind, rng), 0.0)
        models[instance_id] = bundled_model(kind)
        candidates.append(LedgerCandidate(instance_id, ledger, kind, model=served))
    rules = RoutingRules.of_policy(policy)
    tickets = iter(range(1 << 30))
    samples = []
    for i in range(num_decisions):
        served = MIXED_KINDS[i % len(MIXED_KINDS)][0]
        prompt, predicted = rng.randint(20, 2000), rng.randint(10, 800)
        request = RouteRequest(RequestView(f"r{i}", prompt, predicted, max_tokens=1024),
                               model=served)
        started = time.perf_counter()
        outcome = decide_route(request, FleetRead(candidates), rules, DecisionContext(
            now=1.0, rng=rng, next_ticket=lambda _model: next(tickets),
            exec_models=lambda _: models))
        samples.append(time.perf_counter() - started)
        assert isinstance(outcome, Routed)
        ledger.assign(outcome.instance_id, SimRequest(f"r{i}", prompt,
                                                      predicted_output_tokens=predicted), 1.0)
    ordered = sorted(samples)
    return DecisionCost(num_instances, policy, statistics.median(ordered) * 1e6,
                        ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e6,
                        sum(1 for c in candidates if c.model == MIXED_KINDS[0][0]))


def _loaded_snapshot(kind: str, rng: random.Random) -> InstanceSnapshot:
    """An instance of `kind` running a random share of its seats, each request part-way."""
    config = instance_config(kind, max_model_len=MAX_MODEL_LEN)
    requests = []
    free = config.num_usable_blocks
    for j in range(rng.randint(0, config.max_num_seqs // 2)):
        prompt, done = rng.randint(50, 1500), rng.randint(1, 300)
        blocks = -(-(prompt + done) // config.block_size)
        if blocks > free:
            break
        free -= blocks
        requests.append(SimRequest(f"{kind}-{j}", prompt, num_computed_tokens=prompt + done,
                                   num_output_tokens=done,
                                   predicted_output_tokens=done + rng.randint(1, 400),
                                   is_running=True))
    return InstanceSnapshot(config, free, tuple(requests))


def mixed_fleet(num_instances: int, fast_share: float = 1 / 3) -> list[FleetMember]:
    """A pool of one model on unlike GPUs: `fast_share` of A100s, the rest A30s (fleet (a)'s
    mix at any size)."""
    num_fast = round(num_instances * fast_share)
    members = []
    for k in range(num_instances):
        kind = "llama-2-7b-a100" if k < num_fast else "llama-2-7b-a30"
        members.append(FleetMember(instance_config(kind, max_model_len=MAX_MODEL_LEN),
                                   bundled_model(kind)))
    return members


def sharegpt(data: Path, num_requests: int, seed: int = 0) -> Workload:
    """ShareGPT's lengths (the trace repeated past its 10,000 requests: a large fleet needs a
    long run to reach its steady state) with Poisson arrivals."""
    trace = load_length_trace(data / SHAREGPT, max_model_len=MAX_MODEL_LEN, seed=seed)
    repeats = -(-num_requests // len(trace))
    return Workload(f"{trace.name}x{repeats}" if repeats > 1 else trace.name,
                    poisson_unit_arrivals(num_requests, seed),
                    (trace.num_prompt_tokens * repeats)[:num_requests],
                    (trace.num_output_tokens * repeats)[:num_requests])


def run_point(workload: Workload, rate: float, members: Sequence[FleetMember], policy: str, *,
              num_routers: int = 1, decision_s: float = 0.0, predictor: str = "learned-errors",
              seed: int = 0) -> RunResult:
    """One simulated run through production's decision pipeline."""
    setup = ClusterSetup.of_fleet(members, num_routers=num_routers, decision_s=decision_s)
    return simulate(workload, rate, setup, policy, predictor_from_spec(predictor), seed=seed)
