"""Discrete-event simulation of a routed cluster: N instances, one router, one workload. Pure.

The instances are the ground truth (`GroundTruthInstance`: the simulator's scheduler model
with the requests' TRUE output lengths and noisy step times). The router sees only what it
would see in production: snapshots each instance publishes every ``publish_interval_s`` (at
its own phase), the requests it routed since (`FleetLedger`), and the output lengths a length
predictor gave. Block policies simulate each candidate from those with `workers.sim`.

Time advances arrival by arrival. Before a request is routed every instance whose publication
is due runs up to that moment and publishes; the chosen instance then runs up to the arrival
and queues the request. An instance runs whole steps: every step that starts before a moment
is executed, so a snapshot shows the step in flight as done (as a worker publishing mid-step
would show it; at most one step, about 30-60 ms, ahead).

NOTE: instances step one engine step at a time rather than jumping over decode phases as
`workers.sim.FastSim` does: a snapshot is due every ``publish_interval_s`` (2-3 steps) and an
arrival somewhere in the fleet every few steps, so there are few steps to skip; and every
step's time carries its own noise factor.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from workers.route.late_binding import LateBinding
from workers.route.policies import (
    Decision,
    FleetLedger,
    InstanceView,
    RequestView,
    RoutingContext,
    decide,
    needs_what_if,
    probed,
    target_shortfall,
)
from workers.sim import ExecModel, InstanceConfig, SimRequest

from .ground_truth import GroundTruthInstance, SimulatedRequest
from .predictors import LengthPredictor
from .targets import LatencyTarget, met
from .workload import Workload

__all__ = [
    "GROUND_TRUTHS",
    "ClusterSetup",
    "FleetMember",
    "RunResult",
    "capacity_bounds",
    "ground_truth_class",
    "saturation_rate",
    "simulate",
]


@dataclass(frozen=True, slots=True)
class FleetMember:
    """One instance of a fleet of unlike instances (`ClusterSetup.fleet`)."""

    #: Its vLLM settings (KV blocks, batch size).
    config: InstanceConfig
    #: Its ground-truth step times (before noise): its GPU.
    exec_model: ExecModel
    #: Step times the router's what-ifs use for it; None: `exec_model`.
    router_exec_model: ExecModel | None = None
    #: Requests per second it completes with a full queue, as the router is told
    #: (`InstanceView.throughput_rps`: capacity_weighted's weight); None: not told.
    throughput_rps: float | None = None


@dataclass(frozen=True, slots=True)
class ClusterSetup:
    """The fleet and what the router can see of it.

    A fleet of alike instances is `num_instances` x (`config`, `exec_model`); one of unlike
    instances lists each in `fleet` (`of_fleet`), and `config` and `exec_model` are then its
    first member's.
    """

    num_instances: int
    #: Every instance's vLLM settings.
    config: InstanceConfig
    #: Ground-truth step times (before noise).
    exec_model: ExecModel
    #: Step times the router's what-ifs use; None: the ground-truth model (noise aside).
    router_exec_model: ExecModel | None = None
    #: Seconds between two snapshots an instance publishes; 0: the router sees the present.
    publish_interval_s: float = 0.1
    #: Sigma of the lognormal factor (mean 1) multiplying every ground-truth step time.
    exec_noise_sigma: float = 0.1
    #: Give up a run once more than 1 % of its requests wait longer than this for a first
    #: token (TTFT p99 is then known to exceed it); None: never.
    abort_ttft_s: float | None = 20.0
    #: Whose scheduler drives the instances: "ours" (`workers.sim.Scheduler`), "vllm" (the
    #: installed vLLM's own scheduler class; see `vllm_ground_truth`, far slower) or
    #: "vllm-async" (the same with vLLM's async scheduling, its default on one GPU).
    ground_truth: str = "ours"
    #: Every instance's own settings and step times, in instance order (gpu.0, gpu.1, ...);
    #: empty: `num_instances` alike instances.
    fleet: tuple[FleetMember, ...] = ()

    @classmethod
    def of_fleet(cls, fleet: Sequence[FleetMember], **options: object) -> ClusterSetup:
        """A setup of unlike instances; `options` are the other fields."""
        if not fleet:
            raise ValueError("a fleet needs at least one instance")
        return cls(len(fleet), fleet[0].config, fleet[0].exec_model,  # type: ignore[arg-type]
                   fleet=tuple(fleet), **options)

    @property
    def members(self) -> tuple[FleetMember, ...]:
        """Every instance's settings, alike or not."""
        if self.fleet:
            return self.fleet
        return (FleetMember(self.config, self.exec_model, self.router_exec_model),
                ) * self.num_instances

    def __post_init__(self) -> None:
        if self.num_instances < 1:
            raise ValueError("num_instances must be positive")
        if self.fleet and len(self.fleet) != self.num_instances:
            raise ValueError("num_instances must be the fleet's size")
        if self.publish_interval_s < 0 or self.exec_noise_sigma < 0:
            raise ValueError("publish_interval_s and exec_noise_sigma must not be negative")
        if self.ground_truth not in GROUND_TRUTHS:
            raise ValueError(f"ground_truth must be one of {GROUND_TRUTHS}")


#: The instances' schedulers `ClusterSetup.ground_truth` can name.
GROUND_TRUTHS = ("ours", "vllm", "vllm-async")


def ground_truth_class(name: str) -> type[GroundTruthInstance]:
    """The instance class of a ground truth; "vllm" imports vLLM (slow, only when asked)."""
    if name == "ours":
        return GroundTruthInstance
    if name == "vllm":
        from .vllm_ground_truth import VllmGroundTruthInstance
        return VllmGroundTruthInstance
    if name == "vllm-async":
        from .vllm_ground_truth import VllmAsyncGroundTruthInstance
        return VllmAsyncGroundTruthInstance
    raise ValueError(f"unknown ground truth {name!r}; one of {GROUND_TRUTHS}")


# -- one run -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RunResult:
    """One (policy, predictor, rate) point. Latencies in seconds; inf once a run is aborted."""

    policy: str
    predictor: str
    rate: float
    num_requests: int
    #: Given up: more than 1 % of requests waited longer than ``abort_ttft_s``.
    aborted: bool
    ttft_p50_s: float
    ttft_p99_s: float
    e2e_p50_s: float
    e2e_p99_s: float
    #: Finished requests per second, from the first arrival to the last finish.
    throughput_rps: float
    output_tokens_per_s: float
    num_preemptions: int
    #: Median wall time of one routing decision (views, what-ifs, policy), microseconds.
    decision_us_p50: float
    #: Median |simulated - actual| / actual end-to-end latency on the chosen instance
    #: (policies that simulate; NaN otherwise).
    e2e_prediction_error_p50: float
    #: Wall time of the whole run.
    wall_s: float
    #: Per-request TTFT and end-to-end latency, in arrival order (when asked for).
    ttft_s: tuple[float, ...] = field(default=(), repr=False)
    e2e_s: tuple[float, ...] = field(default=(), repr=False)
    #: With latency targets: requests that met theirs per second of arrivals (first to last
    #: arrival), and those refused because no instance's what-if met their target.
    goodput_rps: float = math.nan
    num_met: int = 0
    num_rejected: int = 0
    #: With prefix caching: the share of prompt tokens the instances' caches served.
    prefix_hit_rate: float = math.nan

    @property
    def label(self) -> str:
        return f"{self.policy}[{self.predictor}]"


def simulate(workload: Workload, rate: float, setup: ClusterSetup, policy: str,
             predictor: LengthPredictor, *, seed: int = 0,
             keep_samples: bool = False,
             targets: Sequence[LatencyTarget | None] | None = None,
             route_by_targets: bool = True, reject_unmeetable: bool = False,
             refuse_margin: float = 0.0, router_sees_prefixes: bool = True,
             late_binding: LateBinding | None = None) -> RunResult:
    """Replay `workload` at `rate` requests per second through `policy`; deterministic for `seed`.

    The seed fixes the predicted lengths (the same for every policy and rate), the step-time
    noise of each instance, the publication phases and the router's random draws.

    `targets` (one per request, None: no target) give the run's goodput and, with
    `route_by_targets`, are handed to the router with each request (see
    `workers.route.policies.decide`; without it they are only measured); with
    `reject_unmeetable` a request no instance's what-if meets (by more than `refuse_margin`,
    a share of its target) is refused instead of routed.

    With prefix caching on (``setup.config``) and a workload with prefix hashes the instances
    share cached prefixes; the router sees each request's hashes and the instances' published
    caches unless `router_sees_prefixes` is off (an ablation: the same fleet, a router blind
    to the cache).

    With `late_binding` the router holds a request while no instance would start it soon
    (`LateBinding.would_start`), and releases held requests as instances publish, each to the
    policy's pick among the instances that would start it: oldest first, later ones passing
    a held one only until it has waited `LateBinding.overtake_s`.
    """
    started = time.perf_counter()
    config = setup.config
    arrival_times = workload.arrival_times(rate)
    predicted = predictor.predict(workload, seed)
    router = _Router(setup, policy, seed, late_binding)
    requests: list[SimulatedRequest] = []
    rejected: set[str] = set()
    aborted = False
    for index, arrival_s in enumerate(arrival_times):
        router.advance_to(arrival_s)
        hashes = workload.prefix_hashes_of(index) if config.enable_prefix_caching else ()
        request = SimulatedRequest(f"r{index}", arrival_s, workload.num_prompt_tokens[index],
                                   workload.num_output_tokens[index], predicted[index], hashes)
        requests.append(request)
        target = targets[index] if targets is not None and route_by_targets else None
        routed = _Routed(request, router.planned(request, router_sees_prefixes),
                         RequestView(request.request_id, request.num_prompt_tokens,
                                     predicted[index],
                                     max_tokens=config.max_model_len - request.num_prompt_tokens,
                                     ttft_target_s=target.ttft_s if target else None,
                                     e2e_target_s=target.e2e_s if target else None))
        if not router.route(routed, arrival_s, reject_unmeetable, refuse_margin):
            rejected.add(request.request_id)
        if setup.abort_ttft_s is not None and index % 100 == 99 and _too_late(
                requests, arrival_s, setup.abort_ttft_s, len(workload)):
            aborted = True
            break
    if not aborted:
        router.release_all()
        for engine in router.engines:
            engine.run_to_end()
    result = _result(policy, predictor.name, rate, workload,
                     [r for r in requests if r.request_id not in rejected], router.engines,
                     router.decision_s, aborted, time.perf_counter() - started, keep_samples)
    if targets is None or aborted:
        return result
    return _with_goodput(result, requests, targets, rejected)


@dataclass(slots=True)
class _Routed:
    """A request as the router holds it: its outcome, what it plans with, what policies read."""

    request: SimulatedRequest
    planned: SimRequest
    view: RequestView


class _Router:
    """The fleet and its router: publications on schedule, decisions, held requests."""

    def __init__(self, setup: ClusterSetup, policy: str, seed: int,
                 late_binding: LateBinding | None) -> None:
        instance_class = ground_truth_class(setup.ground_truth)
        self.config = setup.config
        self.policy = policy
        self.late_binding = late_binding
        members = setup.members
        self.engines = [instance_class(f"gpu.{k}", member.config, member.exec_model,
                                       setup.exec_noise_sigma, seed=[seed, 1, k])
                        for k, member in enumerate(members)]
        self._configs = {e.instance_id: m.config for e, m in zip(self.engines, members,
                                                                  strict=True)}
        self._by_id = {e.instance_id: e for e in self.engines}
        self.rng = random.Random(seed)
        self._interval = setup.publish_interval_s
        self._phases = [self.rng.uniform(0.0, self._interval) for _ in self.engines]
        self._published_at = [0.0] * len(self.engines)
        self.ledger = FleetLedger()
        for engine, member in zip(self.engines, members, strict=True):
            self.ledger.publish(engine.instance_id, engine.snapshot(), 0.0)
            if member.throughput_rps is not None:
                self.ledger.set_throughput(engine.instance_id, member.throughput_rps)
        self._what_if_model: ExecModel | dict[str, ExecModel] | None = None
        if needs_what_if(policy):
            self._what_if_model = (
                {e.instance_id: m.router_exec_model or m.exec_model
                 for e, m in zip(self.engines, members, strict=True)} if setup.fleet
                else setup.router_exec_model or setup.exec_model)
        self._held: deque[_Routed] = deque()
        self._decisions = 0
        self.decision_s: list[float] = []

    def planned(self, request: SimulatedRequest, sees_prefixes: bool) -> SimRequest:
        """What the router plans `request` with (the predicted length, no true one)."""
        return SimRequest(request.request_id, request.num_prompt_tokens,
                          predicted_output_tokens=request.predicted_output_tokens,
                          priority=self.engines[0].priority_of(request),
                          prefix_hashes=request.prefix_hashes if sees_prefixes else ())

    def advance_to(self, now_s: float) -> None:
        """Publish every state due by `now_s`; while requests are held, one publication at a
        time, each followed by an attempt to release them."""
        if self.late_binding is not None:
            while self._held:
                k, due = self._next_publication()
                if due > now_s:
                    break
                self._publish(k, due)
                self._release(due, self.engines[k].instance_id)
        for k in range(len(self.engines)):
            due = _last_publication(now_s, self._phases[k], self._interval)
            if due > self._published_at[k]:
                self._publish(k, due)

    def route(self, routed: _Routed, now_s: float, reject_unmeetable: bool,
              refuse_margin: float) -> bool:
        """Route (or hold) a new request at `now_s`; False when it is refused."""
        if self._held and not self._may_overtake(now_s):
            self._held.append(routed)
            return True
        started = time.perf_counter()
        views = self._views(routed)
        decision = self._decide(routed, views)
        self.decision_s.append(time.perf_counter() - started)
        if reject_unmeetable and decision.meets_target is False and (
                target_shortfall(routed.view, views) or 0.0) > 1.0 + refuse_margin:
            return False
        if self.late_binding is not None and not self._startable(routed, views):
            self._held.append(routed)
            return True
        self._bind(routed, decision.instance_id, views, now_s)
        return True

    def release_all(self) -> None:
        """After the last arrival: publish and release until nothing is held."""
        now_s = 0.0
        while self._held:
            k, now_s = self._next_publication()
            self._publish(k, now_s)
            self._release(now_s, self.engines[k].instance_id)

    def _release(self, now_s: float, published: str) -> None:
        """Bind held requests in arrival order while an instance would start the first.

        Only `published` changed since the last attempt: if it would not start the first
        held request, no instance would (their states and routings are as they were)."""
        assert self.late_binding is not None
        if self._may_overtake(now_s):
            self._release_first_fit(now_s, published)
            return
        first = self._held[0]
        if not self._startable(first, self._views(first, [published])):
            return
        while self._held:
            routed = self._held[0]
            started = time.perf_counter()
            views = [v for v in self._views(routed)
                     if self.late_binding.would_start(v, routed.request.num_prompt_tokens,
                                                      self._configs[v.instance_id])]
            if not views:
                return
            decision = self._decide(routed, views)
            self.decision_s.append(time.perf_counter() - started)
            self._held.popleft()
            self._bind(routed, decision.instance_id, views, now_s)

    def _release_first_fit(self, now_s: float, published: str) -> None:
        """Bind to `published` each of the first held requests it would start, in arrival
        order (none of them would start anywhere else: nothing else changed)."""
        assert self.late_binding is not None
        for routed in list(itertools.islice(self._held, self.late_binding.overtake_scan)):
            started = time.perf_counter()
            views = self._views(routed, [published])
            if not self._startable(routed, views):
                continue
            self._decide(routed, views)
            self.decision_s.append(time.perf_counter() - started)
            self._held.remove(routed)
            self._bind(routed, published, views, now_s)

    def _may_overtake(self, now_s: float) -> bool:
        """Whether later requests may pass the held ones: the first has not waited too long."""
        rule = self.late_binding
        return (rule is not None and rule.overtake_s > 0
                and now_s - self._held[0].request.arrival_s < rule.overtake_s)

    def _startable(self, routed: _Routed, views: Sequence[InstanceView]) -> bool:
        assert self.late_binding is not None
        return any(self.late_binding.would_start(v, routed.request.num_prompt_tokens,
                                                 self._configs[v.instance_id]) for v in views)

    def _views(self, routed: _Routed, instance_ids: Sequence[str] | None = None
               ) -> list[InstanceView]:
        if instance_ids is None:
            instance_ids = probed(self.policy, self.ledger.instance_ids, self.rng)
        return self.ledger.views(routed.planned, self._what_if_model, instance_ids)

    def _decide(self, routed: _Routed, views: Sequence[InstanceView]) -> Decision:
        decision = decide(self.policy, routed.view, views,
                          RoutingContext(ticket=self._decisions, rng=self.rng))
        self._decisions += 1
        return decision

    def _bind(self, routed: _Routed, instance_id: str, views: Sequence[InstanceView],
              now_s: float) -> None:
        request = routed.request
        if self._what_if_model is not None:
            request.what_if_e2e_s = next(v.what_if_e2e_s for v in views
                                         if v.instance_id == instance_id)
            # NOTE: the what-if counts from the bind; the request's latency from its arrival.
            request.what_if_e2e_s += now_s - request.arrival_s
        self._by_id[instance_id].add(request, now_s)
        self.ledger.assign(instance_id, routed.planned, now_s)

    def _next_publication(self) -> tuple[int, float]:
        """The instance publishing next and when."""
        if self._interval <= 0:
            raise ValueError("late binding needs a publish interval above 0")
        return min(((k, at + self._interval if at > 0 else self._phases[k])
                    for k, at in enumerate(self._published_at)), key=lambda p: p[1])

    def _publish(self, k: int, due_s: float) -> None:
        engine = self.engines[k]
        engine.run_until(due_s)
        self.ledger.publish(engine.instance_id, engine.snapshot(), due_s)
        self._published_at[k] = due_s


def _with_goodput(result: RunResult, requests: Sequence[SimulatedRequest],
                  targets: Sequence[LatencyTarget | None], rejected: set[str]) -> RunResult:
    """`result` with the requests that met their targets counted (refused ones did not)."""
    num_met = 0
    for request, target in zip(requests, targets, strict=False):
        ran = request.request_id not in rejected and request.finish_s is not None
        num_met += ran and met(target, request.first_token_s - request.arrival_s,
                               request.finish_s - request.arrival_s)
    return dataclasses.replace(result, goodput_rps=num_met / _arrival_span(requests),
                               num_met=num_met, num_rejected=len(rejected))


def _arrival_span(requests: Sequence[SimulatedRequest]) -> float:
    """Seconds from the first arrival to the last: goodput is met requests per second of
    offered load (a drain tail after the last arrival does not dilute it)."""
    return max(requests[-1].arrival_s - requests[0].arrival_s, 1e-9)


def _last_publication(now_s: float, phase_s: float, interval_s: float) -> float:
    """The latest moment at or before `now_s` an instance published (0: its first state)."""
    if interval_s <= 0:
        return now_s
    if now_s < phase_s:
        return 0.0
    return phase_s + math.floor((now_s - phase_s) / interval_s) * interval_s


def _too_late(requests: Sequence[SimulatedRequest], now_s: float, limit_s: float,
              num_total: int) -> bool:
    """Whether more than 1 % of all requests already waited over `limit_s` for a first token."""
    late = 0
    for r in requests:
        if r.first_token_s is None:
            late += now_s - r.arrival_s > limit_s
        else:
            late += r.first_token_s - r.arrival_s > limit_s
    return late > 0.01 * num_total


def _result(policy: str, predictor: str, rate: float, workload: Workload,
            requests: Sequence[SimulatedRequest], engines: Sequence[GroundTruthInstance],
            decision_s: Sequence[float], aborted: bool, wall_s: float,
            keep_samples: bool) -> RunResult:
    num_preemptions = sum(e.num_preemptions for e in engines)
    decision_us = float(np.median(decision_s)) * 1e6 if decision_s else math.nan
    if aborted:
        inf = math.inf
        return RunResult(policy, predictor, rate, len(workload), True, inf, inf, inf, inf,
                         0.0, 0.0, num_preemptions, decision_us, math.nan, wall_s)
    ttft = np.array([r.first_token_s - r.arrival_s for r in requests])
    e2e = np.array([r.finish_s - r.arrival_s for r in requests])
    span_s = max(r.finish_s for r in requests) - requests[0].arrival_s
    predicted = [(r.what_if_e2e_s, r.finish_s - r.arrival_s) for r in requests
                 if r.what_if_e2e_s is not None]
    error = (float(np.median([abs(p - a) / a for p, a in predicted])) if predicted
             else math.nan)
    hit_rate = math.nan
    if engines and engines[0].config.enable_prefix_caching:
        hit_rate = (sum(r.num_cached_tokens or 0 for r in requests)
                    / sum(r.num_prompt_tokens for r in requests))
    return RunResult(
        policy=policy, predictor=predictor, rate=rate, num_requests=len(requests), aborted=False,
        ttft_p50_s=float(np.percentile(ttft, 50)), ttft_p99_s=float(np.percentile(ttft, 99)),
        e2e_p50_s=float(np.percentile(e2e, 50)), e2e_p99_s=float(np.percentile(e2e, 99)),
        throughput_rps=len(requests) / span_s,
        output_tokens_per_s=sum(r.max_output_tokens for r in requests) / span_s,
        num_preemptions=num_preemptions, decision_us_p50=decision_us,
        e2e_prediction_error_p50=error, wall_s=wall_s,
        ttft_s=tuple(ttft.tolist()) if keep_samples else (),
        e2e_s=tuple(e2e.tolist()) if keep_samples else (),
        prefix_hit_rate=hit_rate,
    )


def saturation_rate(workload: Workload, config: InstanceConfig, exec_model: ExecModel,
                    num_requests: int | None = None) -> float:
    """Requests per second one instance completes with a full queue: the fleet's ceiling / N.

    The first `num_requests` requests (all by default) arrive at once (no noise): no routing
    policy sustains more than N times this rate on this workload for long. A finite run can
    stay under a TTFT SLO a little above it, while its backlog is still short.
    """
    instance = GroundTruthInstance("saturated", config, exec_model)
    count = len(workload) if num_requests is None else min(num_requests, len(workload))
    for index in range(count):
        instance.add(SimulatedRequest(f"r{index}", 0.0, workload.num_prompt_tokens[index],
                                      workload.num_output_tokens[index],
                                      workload.num_output_tokens[index],
                                      workload.prefix_hashes_of(index)), 0.0)
    instance.run_to_end()
    return count / instance.now_s


# -- capacity --------------------------------------------------------------------------------

def capacity_bounds(ttft_p99_by_rate: Mapping[float, float],
                    slo_s: float) -> tuple[float | None, float | None]:
    """(highest passing rate below the lowest failing one, lowest failing rate).

    A rate passes when its TTFT p99 is at most `slo_s`. None where no rate passes, or none
    fails; the capacity lies between the two (bisect to narrow it).
    """
    failing = [r for r, p99 in ttft_p99_by_rate.items() if not p99 <= slo_s]
    high = min(failing) if failing else None
    passing = [r for r, p99 in ttft_p99_by_rate.items()
               if p99 <= slo_s and (high is None or r < high)]
    return (max(passing) if passing else None), high
