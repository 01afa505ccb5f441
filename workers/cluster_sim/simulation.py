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
from collections import defaultdict, deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from workers.route.late_binding import Held, LateBinding, must_wait, release
from workers.route.pipeline import (
    DecisionContext,
    FleetRead,
    Routed,
    RouteRequest,
    RoutingRules,
    Unrouted,
    decide_route,
)
from workers.route.policies import FleetLedger, RequestView, reads_state
from workers.route.targets import RequestTargets, SloMissAction
from workers.sim import ExecModel, InstanceConfig, SimRequest
from workers.sim.future_load import NO_FUTURE_LOAD, FutureLoad
from workers.sim.published import Published

from .ground_truth import GroundTruthInstance, SimulatedRequest
from .predictors import LengthPredictor
from .targets import LatencyTarget, met
from .workload import Workload

__all__ = [
    "GROUND_TRUTHS",
    "ClusterSetup",
    "FleetMember",
    "LedgerCandidate",
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
    #: Give up a run once so many of its requests waited longer than this for a first token
    #: that its TTFT p99 is known to exceed it (`p99_certainly_over`); None: never.
    abort_ttft_s: float | None = 20.0
    #: The same for end-to-end latency (unfinished requests older than this count); None: never.
    abort_e2e_s: float | None = None
    #: Whose scheduler drives the instances: "ours" (`workers.sim.Scheduler`), "vllm" (the
    #: installed vLLM's own scheduler class; see `vllm_ground_truth`, far slower) or
    #: "vllm-async" (the same with vLLM's async scheduling, its default on one GPU).
    ground_truth: str = "ours"
    #: Every instance's own settings and step times, in instance order (gpu.0, gpu.1, ...);
    #: empty: `num_instances` alike instances.
    fleet: tuple[FleetMember, ...] = ()
    #: Routers deciding side by side (each API process routes its own held completions), each
    #: taking the arrivals in turn; with `decision_s` above 0 a decision sees another's
    #: assignment only once that one is noted, `decision_s` after it started (the herd effect).
    num_routers: int = 1
    #: Simulated time one routing decision takes, from reading the fleet to noting the
    #: assignment; a router decides one request at a time. 0: decisions are instant.
    decision_s: float = 0.0

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
        if self.publish_interval_s < 0 or self.exec_noise_sigma < 0 or self.decision_s < 0:
            raise ValueError("publish_interval_s, exec_noise_sigma and decision_s must not be "
                             "negative")
        if self.num_routers < 1:
            raise ValueError("num_routers must be positive")
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
    #: Given up: its TTFT p99 was known to exceed ``abort_ttft_s``, or its e2e p99
    #: ``abort_e2e_s``.
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
             late_binding: LateBinding | None = None,
             rules: RoutingRules | None = None) -> RunResult:
    """Replay `workload` at `rate` requests per second through `policy`; deterministic for `seed`.

    Every decision is production's: the decision pipeline (`workers.route.pipeline`) on the
    router's view of the fleet. `rules` (production's, e.g. from the settings) set the policy
    and the rest; without them every pool is routed with `policy`, late binding by
    `late_binding`, refusals with `refuse_margin`.

    The seed fixes the predicted lengths (the same for every policy and rate), the step-time
    noise of each instance, the publication phases and the router's random draws.

    `targets` (one per request, None: no target) give the run's goodput and, with
    `route_by_targets`, are handed to the router with each request (without it they are only
    measured); with `reject_unmeetable` the requests' team refuses what no instance's what-if
    meets (by more than the rules' refuse margin, a share of its target).

    With prefix caching on (``setup.config``) and a workload with prefix hashes the instances
    share cached prefixes; the router sees each request's hashes and the instances' published
    caches unless `router_sees_prefixes` is off (an ablation: the same fleet, a router blind
    to the cache).

    With late binding the router holds a request while no instance would start it soon
    (`LateBinding.would_start`), and releases held requests as instances publish
    (`late_binding.release`), as the route task does.
    """
    started = time.perf_counter()
    config = setup.config
    arrival_times = workload.arrival_times(rate)
    predicted = predictor.predict(workload, seed)
    if rules is None:
        rules = RoutingRules.of_policy(policy, late_binding=late_binding,
                                       refuse_margin=refuse_margin)
    router = RoutedFleet(setup, rules, seed)
    miss_action = SloMissAction.REFUSE if reject_unmeetable else SloMissAction.ROUTE
    requests: list[SimulatedRequest] = []
    aborted = False
    for index, arrival_s in enumerate(arrival_times):
        decided_at = router.decision_start(index, arrival_s)
        router.advance_to(decided_at)
        hashes = workload.prefix_hashes_of(index) if config.enable_prefix_caching else ()
        request = SimulatedRequest(f"r{index}", arrival_s, workload.num_prompt_tokens[index],
                                   workload.num_output_tokens[index], predicted[index], hashes)
        requests.append(request)
        target = targets[index] if targets is not None and route_by_targets else None
        router.route(RoutedRequest(
            request, router.planned(request, router_sees_prefixes),
            RequestView(request.request_id, request.num_prompt_tokens, predicted[index],
                        max_tokens=config.max_model_len - request.num_prompt_tokens,
                        prefix_hashes=hashes if router_sees_prefixes else ()),
            None if target is None else RequestTargets.of(
                None if target.ttft_s is None else target.ttft_s * 1000,
                None if target.e2e_s is None else target.e2e_s * 1000,
                miss_action, _moment(arrival_s))), decided_at)
        if index % 100 == 99:
            router.catch_up(arrival_s)
            if _too_late(requests, arrival_s, setup, len(workload)):
                aborted = True
                break
    if not aborted:
        router.release_all()
        for engine in router.engines:
            engine.run_to_end()
    rejected = router.rejected
    result = _result(rules.policy, predictor.name, rate, workload,
                     [r for r in requests if r.request_id not in rejected], router.engines,
                     router.decision_s, aborted, time.perf_counter() - started, keep_samples)
    if targets is None or aborted:
        return result
    return _with_goodput(result, requests, targets, rejected)


def _moment(at_s: float) -> datetime:
    """A simulated moment (seconds from the run's start) as the pipeline's clock reads it."""
    return datetime.fromtimestamp(at_s, UTC)


@dataclass(slots=True)
class RoutedRequest:
    """A request as the router holds it: its outcome, what it plans with, what policies read."""

    request: SimulatedRequest
    planned: SimRequest
    view: RequestView
    targets: RequestTargets | None = None
    #: Since when it is held (late binding), if it is.
    held: Held | None = None


@dataclass(frozen=True, slots=True)
class LedgerCandidate:
    """An instance as the simulated router reads it: its entry in the router's ledger (the
    `Candidate` the decision pipeline plans on; production's is `InstanceStatus`)."""

    instance_id: str
    ledger: FleetLedger
    #: What it runs on (its execution-time model): a pool of unlike ones is a mixed fleet.
    hardware: str
    model: str | None = None
    routable: bool = True
    future_load: FutureLoad = NO_FUTURE_LOAD

    def published(self) -> Published:
        return self.ledger.published(self.instance_id)


class RoutedFleet:
    """The fleet and its router: publications on schedule, decisions, held requests."""

    def __init__(self, setup: ClusterSetup, rules: RoutingRules, seed: int) -> None:
        instance_class = ground_truth_class(setup.ground_truth)
        self.config = setup.config
        self.rules = rules
        members = setup.members
        self.engines = [instance_class(f"gpu.{k}", member.config, member.exec_model,
                                       setup.exec_noise_sigma, seed=[seed, 1, k])
                        for k, member in enumerate(members)]
        self._by_id = {e.instance_id: e for e in self.engines}
        self.rng = random.Random(seed)
        self._interval = setup.publish_interval_s
        # NOTE: a router that reads no state (round robin, no late binding) makes the same
        # decisions unpublished, and an instance runs the same steps whether or not it stops to
        # publish on the way: skipping the snapshots changes no result.
        self._publishes = (rules.late_binding is not None or reads_state(rules.policy)
                           or reads_state(rules.mixed_fleet_policy))
        self._phases = [self.rng.uniform(0.0, self._interval) for _ in self.engines]
        self._published_at = [0.0] * len(self.engines)
        self.ledger = FleetLedger()
        self._what_if_models = {e.instance_id: m.router_exec_model or m.exec_model
                                for e, m in zip(self.engines, members, strict=True)}
        self._candidates = [LedgerCandidate(e.instance_id, self.ledger,
                                            self._what_if_models[e.instance_id].name)
                            for e in self.engines]
        for engine, member in zip(self.engines, members, strict=True):
            self.ledger.publish(engine.instance_id, engine.snapshot(), 0.0)
            if member.throughput_rps is not None:
                self.ledger.set_throughput(engine.instance_id, member.throughput_rps)
        self._tickets: dict[str, Iterator[int]] = defaultdict(itertools.count)
        self._decision_s = setup.decision_s
        self._router_free_at = [0.0] * setup.num_routers
        # Assignments not noted yet: (when noted, instance, request as planned, bound at).
        self._unnoted: list[tuple[float, str, SimRequest, float]] = []
        self._held: deque[RoutedRequest] = deque()
        self.rejected: set[str] = set()
        self.decision_s: list[float] = []

    def planned(self, request: SimulatedRequest, sees_prefixes: bool) -> SimRequest:
        """What the router notes of `request` once routed (the predicted length, no true one)."""
        return SimRequest(request.request_id, request.num_prompt_tokens,
                          predicted_output_tokens=request.predicted_output_tokens,
                          priority=self.engines[0].priority_of(request),
                          prefix_hashes=request.prefix_hashes if sees_prefixes else ())

    def advance_to(self, now_s: float) -> None:
        """Publish every state due by `now_s`; while requests are held, one publication at a
        time, each followed by an attempt to release them."""
        if self.rules.late_binding is not None:
            while self._held:
                k, due = self._next_publication()
                if due > now_s:
                    break
                self._publish(k, due)
                self._release(due)
        if not self._publishes:
            return
        for k in range(len(self.engines)):
            due = _last_publication(now_s, self._phases[k], self._interval)
            if due > self._published_at[k]:
                self._publish(k, due)

    def catch_up(self, now_s: float) -> None:
        """Run every instance up to `now_s` (whole steps, as it would run anyway): the first
        tokens and finishes a check of the run's progress reads."""
        for engine in self.engines:
            engine.run_until(now_s)

    def route(self, routed: RoutedRequest, now_s: float) -> None:
        """Route, hold or refuse a new request at `now_s`, as the route task would."""
        rule = self.rules.late_binding
        if rule is not None and self._held and must_wait(
                None, (r.held for r in self._held if r.held is not None), now_s, rule.overtake_s):
            self._hold(routed, now_s)
            return
        outcome = self._decide(routed, now_s)
        if outcome is Unrouted.HELD:
            self._hold(routed, now_s)
        elif isinstance(outcome, Routed):
            self._apply(routed, outcome, now_s)

    def decision_start(self, index: int, arrival_s: float) -> float:
        """When the router taking the `index`-th arrival starts deciding it: at its arrival,
        or once that router has finished its previous decision."""
        k = index % len(self._router_free_at)
        start = max(arrival_s, self._router_free_at[k])
        self._router_free_at[k] = start + self._decision_s
        return start

    def decide(self, routed: RoutedRequest, now_s: float,
               held_since: float | None = None) -> Routed | Unrouted:
        """The decision pipeline on what the router knows at `now_s` (nothing applied)."""
        self._note_due(now_s)
        return decide_route(
            RouteRequest(routed.view, targets=routed.targets, held_since=held_since),
            FleetRead(self._candidates), self.rules,
            DecisionContext(now=now_s, rng=self.rng,
                            next_ticket=lambda model: next(self._tickets[model]),
                            exec_models=lambda _: self._what_if_models))

    def release_all(self) -> None:
        """After the last arrival: publish and release until nothing is held."""
        while self._held:
            k, now_s = self._next_publication()
            self._publish(k, now_s)
            self._release(now_s)

    def _decide(self, routed: RoutedRequest, now_s: float,
                held_since: float | None = None) -> Routed | Unrouted:
        started = time.perf_counter()
        outcome = self.decide(routed, now_s, held_since)
        self.decision_s.append(time.perf_counter() - started)
        return outcome

    def _hold(self, routed: RoutedRequest, now_s: float) -> None:
        routed.held = Held(routed.request.request_id, now_s)
        self._held.append(routed)

    def _release(self, now_s: float) -> None:
        """Try the held requests, oldest first, in `late_binding.release`'s order."""
        rule = self.rules.late_binding
        assert rule is not None
        scan = {r.request.request_id: r for r in itertools.islice(self._held, rule.overtake_scan)}

        def try_route(held: Held) -> bool:
            routed = scan[held.request_id]
            outcome = self._decide(routed, now_s, held_since=held.since)
            if not isinstance(outcome, Routed):
                return False
            self._apply(routed, outcome, now_s)
            return True

        released = release([r.held for r in scan.values() if r.held is not None], now_s,
                            rule.overtake_s, try_route)
        for held in released:
            self._held.remove(scan[held.request_id])

    def _apply(self, routed: RoutedRequest, outcome: Routed, now_s: float) -> None:
        """Refuse the request, or bind it to the chosen instance at `now_s`."""
        request = routed.request
        if outcome.refused:
            self.rejected.add(request.request_id)
            return
        instance_id = outcome.instance_id
        bound_s = now_s + self._decision_s
        if instance_id in outcome.plan.what_ifs:
            # NOTE: the what-if counts from the bind; the request's latency from its arrival.
            request.what_if_e2e_s = (outcome.plan.what_ifs[instance_id][1]
                                     + bound_s - request.arrival_s)
        self._by_id[instance_id].add(request, bound_s)
        if self._decision_s > 0:
            self._unnoted.append((bound_s, instance_id, routed.planned, bound_s))
        else:
            self.ledger.assign(instance_id, routed.planned, now_s)

    def _note_due(self, now_s: float) -> None:
        """Note the assignments whose decisions ended by `now_s`: what every router sees."""
        if not self._unnoted:
            return
        due = [a for a in self._unnoted if a[0] <= now_s]
        if due:
            self._unnoted = [a for a in self._unnoted if a[0] > now_s]
            for _, instance_id, planned, bound_s in due:
                self.ledger.assign(instance_id, planned, bound_s)

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


def p99_certainly_over(num_late: int, num_total: int) -> bool:
    """Whether `num_late` of `num_total` values above a limit put their 99th percentile (NumPy's
    linear interpolation) above it, whatever the other values: both values it interpolates
    between, at ranks floor and ceil of 0.99 (n - 1), are then among the late ones."""
    return num_late >= 1 + math.ceil(0.01 * (num_total - 1))


def _too_late(requests: Sequence[SimulatedRequest], now_s: float, setup: ClusterSetup,
              num_total: int) -> bool:
    """Whether the run's TTFT or e2e p99 is already known to exceed the setup's abort limit:
    requests still waiting count as late once their wait alone is over it."""
    ttft_limit, e2e_limit = setup.abort_ttft_s, setup.abort_e2e_s
    if ttft_limit is None and e2e_limit is None:
        return False
    late_ttft = late_e2e = 0
    for r in requests:
        if ttft_limit is not None:
            late_ttft += (now_s if r.first_token_s is None else r.first_token_s) \
                - r.arrival_s > ttft_limit
        if e2e_limit is not None:
            late_e2e += (now_s if r.finish_s is None else r.finish_s) - r.arrival_s > e2e_limit
    return (p99_certainly_over(late_ttft, num_total)
            or p99_certainly_over(late_e2e, num_total))


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
