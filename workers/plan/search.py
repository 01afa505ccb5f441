"""The search: the cheapest fleet of a catalog's GPU kinds that meets every model's latency
targets, each candidate judged by the cluster simulation that runs blockq's routing decision.

The production router routes a request only among its model's instances, so each model's pool
is planned on its own requests and the fleet's cost is the pools' sum. For one pool:

1. **Bounds.** Each kind's saturated rate on the pool's workload (`saturation_rate`) bounds how
   few instances can carry the rate (a fleet below it cannot keep up for long), and a lone
   request's latency on the kind (no queue, no batch) says whether the kind can meet the
   targets at all; neither needs the simulation.
2. **One kind.** The fewest instances of each kind that meet the targets: up from the
   throughput bound, doubling, then bisected.
3. **Two kinds.** For each pair, the staircase of the fewest ``b`` for ``1, 2, ...`` of ``a``:
   that count never grows as ``a`` grows, so each row starts from the last row's count (known
   to pass) and steps down until a count fails. Only points cheaper than the best fleet found
   so far and above the throughput bound are simulated: the simulation runs only near the
   frontier.
4. **Headroom.** The rate scale at which the chosen pool first misses a target, bisected.

A run stops as soon as a target is certain to be missed (enough requests already waited past
it that the p99 must exceed it): most of the search's runs fail, and finishing them took most
of its time. Figures that are reported (the routing-blind plan, the closest miss when no pool
meets the targets) come from runs to the end.

Every run replays the pool's whole workload at its rate, lengthened by repetition to at least
`PlanOptions.min_requests_per_instance` requests an instance and `min_requests_per_pool` in all
(a finite run passes above the steady state while its backlog is short, and a p99 of a few
hundred requests is chance: docs/benchmarks_cluster.md, docs/plan_live.md). A pool of one kind is
routed with `PlanOptions.single_policy`, one of unlike kinds with `mixed_policy`: the production
defaults (`domain.settings.Settings.routing_policy_for`), which the caller passes in.

With worker processes (`runs.Runner`), the pools and each pool's kinds are searched at once,
and the staircases and the headroom bisection start the runs they will probably need next
(`PoolJudge.prefetch`); the verdicts, and so the plan, are the same as with one process.

NOTE: the staircase and the bisections assume a pool that meets its targets still meets them
with one more instance (monotonicity). Pools of three or more kinds are not searched.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from workers.cluster_sim import (
    DEFAULT_PREDICTOR,
    ClusterSetup,
    FleetMember,
    RunResult,
    Workload,
    predictor_from_spec,
    saturation_rate,
    simulate,
)
from workers.sim import BatchStats

from .baseline import routing_blind_mix
from .catalog import Catalog
from .derive import KindModel, kind_model
from .runs import Runner
from .workload import PlanInputError, PlanWorkload

__all__ = ["Alternative", "FleetPlan", "PlanOptions", "PoolJudge", "PoolResult", "Targets",
           "lengthened", "lone_latency", "plan_fleet", "run_pool"]

#: Rate scales the headroom search tries before it bisects.
HEADROOM_STEPS = (1.1, 1.25, 1.5, 2.0, 3.0, 4.0)
#: A pool's counts by GPU kind, in the catalog's order: ((kind, count), ...).
Mix = tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class Targets:
    """A model's latency targets, seconds at the 99th percentile (None: no such target)."""

    ttft_p99_s: float | None = None
    e2e_p99_s: float | None = None

    def __post_init__(self) -> None:
        if self.ttft_p99_s is None and self.e2e_p99_s is None:
            raise ValueError("a target needs ttft_p99, e2e_p99 or both")

    def met_by(self, ttft_p99_s: float, e2e_p99_s: float) -> bool:
        return ((self.ttft_p99_s is None or ttft_p99_s <= self.ttft_p99_s)
                and (self.e2e_p99_s is None or e2e_p99_s <= self.e2e_p99_s))

    def shortfall(self, ttft_p99_s: float, e2e_p99_s: float) -> float:
        """The worst figure / target ratio (at most 1: met)."""
        ratios = [figure / target for figure, target in ((ttft_p99_s, self.ttft_p99_s),
                                                          (e2e_p99_s, self.e2e_p99_s))
                  if target is not None]
        return max(ratios)

    def describe(self) -> str:
        parts = [f"{name}<={value:g}s" for name, value in (("ttft_p99", self.ttft_p99_s),
                                                            ("e2e_p99", self.e2e_p99_s))
                 if value is not None]
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """How the search judges and how far it looks."""

    #: Routing policy of a pool of one GPU kind, and of one of unlike kinds.
    single_policy: str = "round_robin"
    mixed_policy: str = "block_slo"
    #: The router's output lengths (the shipped length model's measured errors).
    predictor: str = DEFAULT_PREDICTOR
    seed: int = 0
    #: Step-time noise and publication interval of the simulated instances.
    exec_noise_sigma: float = 0.1
    publish_interval_s: float = 0.1
    #: A run replays at least this many requests an instance, and this many in all (the
    #: workload repeated): a p99 rests on its run's slowest hundredth, and a pool near its
    #: limit builds its backlog over the run. docs/plan_live.md's chat pool of two A30s
    #: (600 requests) had a TTFT p99 of 0.85-1.20 s over 20 seeds (0.91 s at the seed the
    #: planner used), and 1.14-1.28 s replayed to 3,000 requests (1.19-1.27 s to 6,000).
    min_requests_per_instance: int = 100
    min_requests_per_pool: int = 3000
    #: Most instances of one kind in one pool the search tries.
    max_instances: int = 64
    #: Requests one instance is saturated with to measure its rate.
    saturation_requests: int = 1000
    #: The throughput bound prunes a pool whose saturated rates sum below this share of the
    #: offered rate: a saturated rate measured on a finite queue includes its drain tail and
    #: runs 10-15 % under the steady state, so the bound keeps that much slack.
    bound_slack: float = 0.8
    #: Headroom is bisected to this share of the rate scale.
    headroom_resolution: float = 0.05
    #: Most rate scale the headroom search looks at, as a multiple of the plan's.
    headroom_max: float = 4.0


@dataclass(frozen=True, slots=True)
class PoolResult:
    """One pool judged by the simulation."""

    model: str
    mix: Mix
    rate_scale: float
    ttft_p99_s: float
    e2e_p99_s: float
    meets: bool
    num_requests: int
    policy: str

    @property
    def num_instances(self) -> int:
        return sum(count for _, count in self.mix)


@dataclass(frozen=True, slots=True)
class Alternative:
    """A fleet for comparison: the cheapest of one kind, or the routing-blind plan."""

    name: str
    #: Each model's pool (None where none was found: the kind cannot meet its targets).
    pools: Mapping[str, PoolResult | None]
    cost_per_hour: float

    @property
    def meets_targets(self) -> bool:
        return all(p is not None and p.meets for p in self.pools.values())


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """The planned fleet, its predicted latencies, headroom and the alternatives."""

    pools: Mapping[str, PoolResult]
    cost_per_hour: float
    #: The rate scale at which some model's pool first misses a target (relative to the
    #: planned workload, itself at `rate_scale` x the input's rate).
    headroom: float
    #: Per model, the headroom of its own pool.
    headroom_by_model: Mapping[str, float]
    alternatives: tuple[Alternative, ...]
    kind_models: Mapping[tuple[str, str], KindModel]
    saturated_rps: Mapping[tuple[str, str], float]
    rate_scale: float
    num_simulations: int
    notes: tuple[str, ...] = field(default=())


def lone_latency(model: KindModel, prompt_tokens: int, output_tokens: int) -> tuple[float, float]:
    """TTFT and end-to-end seconds of a request alone on an idle instance (no queue, no batch):
    the fastest the kind can serve it."""
    budget = model.config.max_num_batched_tokens
    exec_model = model.exec_model
    ttft_ms, done = 0.0, 0
    while done < prompt_tokens:
        chunk = min(budget, prompt_tokens - done)
        ttft_ms += exec_model.step_ms(BatchStats(
            num_prefill_tokens=chunk, num_prefill_seqs=1, prefill_chunk_x_context=chunk * done,
            prefill_chunk_sq=chunk * chunk))
        done += chunk
    decode_ms = exec_model.sum_decode_steps_ms(1, prompt_tokens + 1, output_tokens - 1)
    return ttft_ms / 1000, (ttft_ms + decode_ms) / 1000


class PoolJudge:
    """One model's pool: its workload, rate and targets, and every kind it may run on; judges
    mixes by simulation and remembers each verdict. Safe to use from several threads (the
    kinds are searched at once when `runner` has worker processes)."""

    def __init__(self, model: str, workload: Workload, rate: float, targets: Targets,
                 kinds: Mapping[str, KindModel], prices: Mapping[str, float],
                 max_counts: Mapping[str, int | None], options: PlanOptions,
                 runner: Runner | None = None) -> None:
        self.model = model
        self.workload = workload
        self.rate = rate
        self.targets = targets
        self.kinds = dict(kinds)
        self.prices = dict(prices)
        self.options = options
        self.runner = runner or Runner()
        self.max_counts = {k: min(options.max_instances, max_counts.get(k) or math.inf)
                           for k in kinds}
        sample = workload.head(options.saturation_requests)
        self.saturated = {k: saturation_rate(sample, m.config, m.exec_model)
                          for k, m in self.kinds.items()}
        self.lone_ok = {k: self._lone_ok(m) for k, m in self.kinds.items()}
        self._runs: dict[tuple[Mix, float], Future[PoolResult]] = {}
        self._used: set[Future[PoolResult]] = set()
        #: The (mix, scale) the search asked for (not those only run ahead of need).
        self._judged: set[tuple[Mix, float]] = set()
        #: Each search thread's last runs asked for ahead (`prefetch`).
        self._guesses: dict[int, list[tuple[Mix, float]]] = {}
        self._lock = threading.Lock()
        #: Simulations whose verdicts the search used (runs made ahead of need and never
        #: used are not counted: the count is the same with any number of worker processes).
        self.num_simulations = 0

    # -- judging -------------------------------------------------------------------------
    def _lone_ok(self, model: KindModel) -> list[bool]:
        """Per request, whether it meets the targets alone on the kind."""
        return [self.targets.met_by(*lone_latency(model, p, o)) for p, o in
                zip(self.workload.num_prompt_tokens, self.workload.num_output_tokens, strict=True)]

    def can_meet(self, kind: str) -> bool:
        """Whether the kind meets the targets at p99 for lone requests (a necessary bound)."""
        ok = self.lone_ok[kind]
        return sum(ok) >= 0.99 * len(ok)

    def capacity(self, mix: Mix, scale: float = 1.0) -> bool:
        """The throughput bound: the mix's saturated rates sum above the offered rate."""
        return (sum(self.saturated[k] * n for k, n in mix)
                > self.options.bound_slack * self.rate * scale)

    def cost(self, mix: Mix) -> float:
        return sum(self.prices[k] * n for k, n in mix)

    def judge(self, mix: Mix, scale: float = 1.0) -> PoolResult:
        """The mix at `scale` x the pool's rate, simulated (or a failing verdict without a run
        when below the throughput bound)."""
        key = self._key(mix, scale)
        with self._lock:
            self._judged.add(key)
        return self._verdict(self._run_of(mix, scale))

    def _verdict(self, run: Future[PoolResult]) -> PoolResult:
        """The run's verdict, counted once among the simulations the search used."""
        self.runner.hurry(run)
        result = run.result()
        with self._lock:
            if result.num_requests and run not in self._used:
                self._used.add(run)
                self.num_simulations += 1
        return result

    def prefetch(self, *candidates: tuple[Mix, float]) -> None:
        """Start the runs of `(mix, scale)` candidates a search will probably judge next, where
        a worker process would otherwise idle (nothing, without worker processes)."""
        if not self.runner.parallel:
            return
        keys = [self._key(mix, scale) for mix, scale in candidates]
        with self._lock:  # the same search's earlier guesses, not started: moot now
            for key in self._guesses.pop(threading.get_ident(), []):
                if key not in keys and self.runner.withdraw(self._runs[key]):
                    del self._runs[key]
            self._guesses[threading.get_ident()] = keys
        for mix, scale in candidates:
            self._run_of(mix, scale, ahead=True)

    def prefetch_to_the_end(self, mix: Mix) -> None:
        """Start the run `to_the_end` will want for `mix` (its verdict is the one a run given
        up gives: a run stops early only when its end must miss the targets)."""
        if self.runner.parallel:
            self._run_of(mix, 1.0, give_up=False, ahead=True)

    def _run_of(self, mix: Mix, scale: float, *, give_up: bool = True, ahead: bool = False
                ) -> Future[PoolResult]:
        key = self._key(mix, scale)
        mix = key[0]
        with self._lock:
            if key not in self._runs:
                self._runs[key] = self._start(mix, scale, give_up=give_up, ahead=ahead)
            return self._runs[key]

    def _key(self, mix: Mix, scale: float) -> tuple[Mix, float]:
        counts = dict(mix)  # in the catalog's order: the same pool is the same run
        return (tuple((k, counts[k]) for k in self.kinds if counts.get(k, 0) > 0),
                round(scale, 6))

    def _start(self, mix: Mix, scale: float, *, give_up: bool, ahead: bool = False
               ) -> Future[PoolResult]:
        """The run's future (a done one, failing, below the throughput bound). With `give_up`,
        the run stops as soon as a target is certain to be missed (most of the search's runs
        fail, and most of its time went to finishing them)."""
        policy = self.policy_of(mix)
        if not mix or not self.capacity(mix, scale):
            done: Future[PoolResult] = Future()
            done.set_result(PoolResult(self.model, mix, scale, math.inf, math.inf, False, 0,
                                       policy))
            return done
        return self.runner.submit(judged_run, self.model, self.workload, self.rate, self.targets,
                                  self.members(mix), mix, scale, policy, self.options, give_up,
                                  ahead=ahead)

    def to_the_end(self, mix: Mix) -> PoolResult:
        """The mix's verdict with its figures: a run the search gave up is run to its end."""
        result = self.judge(mix)
        if result.meets or math.isfinite(result.ttft_p99_s) or result.num_requests == 0:
            return result
        with self._lock:
            run = self._start(result.mix, 1.0, give_up=False)
            self._runs[(result.mix, 1.0)] = run
        return self._verdict(run)

    def closest_miss(self) -> PoolResult | None:
        """Where no pool meets the targets: the largest pool of each kind the search tried,
        simulated to its end (the search gives a run up as soon as it must fail), the one
        closest to the targets (None: no kind could be tried)."""
        largest: dict[str, int] = {}
        for mix, scale in list(self._judged):
            if scale == 1.0 and len(mix) == 1:
                kind, count = mix[0]
                largest[kind] = max(largest.get(kind, 0), count)
        runs = [self.to_the_end(((kind, count),)) for kind, count in largest.items()]
        return min((r for r in runs if math.isfinite(r.ttft_p99_s)), default=None,
                   key=lambda r: self.targets.shortfall(r.ttft_p99_s, r.e2e_p99_s))

    def policy_of(self, mix: Mix) -> str:
        return self.options.mixed_policy if len(mix) > 1 else self.options.single_policy

    def members(self, mix: Mix) -> list[FleetMember]:
        return [FleetMember(self.kinds[k].config, self.kinds[k].exec_model,
                            throughput_rps=self.saturated[k])
                for k, n in mix for _ in range(n)]

    # -- searching -----------------------------------------------------------------------
    def fewest(self, kind: str) -> PoolResult | None:
        """The fewest instances of `kind` alone that meet the targets (None: none up to its
        limit does)."""
        limit = self.max_counts[kind]
        if not self.can_meet(kind) or limit < 1:
            return None

        def mix(count: int) -> Mix:
            return ((kind, count),)

        # At or below the bound: fails (unless it is 1, checked at the end).
        low = max(1, math.floor(self.options.bound_slack * self.rate / self.saturated[kind]))
        high = min(limit, max(low + 1, math.ceil(1.2 * self.rate / self.saturated[kind])))
        # NOTE: nothing is run ahead here: the kinds and pools are searched at once, which
        # keeps the worker processes busy (runs ahead only delayed needed ones).
        while not self.judge(mix(high)).meets:
            if high >= limit:
                return None
            low, high = high, min(limit, math.ceil(1.5 * high))
        high = self._fewest_passing(low, high, mix, ahead=False)
        if low >= 1 and self.judge(mix(low)).meets:  # the bound itself may pass
            return self.judge(mix(low))
        return self.judge(mix(high))

    def _fewest_passing(self, low: int, high: int, mix: Callable[[int], Mix], *, ahead: bool
                        ) -> int:
        """The fewest count in (low, high] whose mix passes, bisected: `high` passes and `low`
        fails (by monotonicity, every count between is one or the other). With `ahead`, each
        middle's run starts with both runs that may follow it."""
        while high - low > 1:
            middle = (low + high) // 2
            if ahead:
                self.prefetch(*[(mix(count), 1.0) for count in
                                ((low + middle) // 2, (middle + high) // 2)
                                if low < count < high])
            if self.judge(mix(middle)).meets:
                high = middle
            else:
                low = middle
        return high

    def _row_top(self, kind_a: str, kind_b: str, count_a: int, known: int, best_cost: float
                 ) -> int:
        """A staircase row's first candidate: the most `kind_b` below `known` that keeps the
        mix cheaper than `best_cost` (below 1: none)."""
        return min(known - 1, math.ceil((best_cost - self.prices[kind_a] * count_a)
                                        / self.prices[kind_b]) - 1)

    def _first_run(self, kind_a: str, kind_b: str, known: int, best_cost: float,
                   from_row: int) -> Mix | None:
        """The staircase's next simulated candidate from row `from_row` on, if every row
        before it fails (rows below the throughput bound fail without a run)."""
        for count_a in range(from_row, self.max_counts[kind_a] + 1):
            top = self._row_top(kind_a, kind_b, count_a, known, best_cost)
            if top < 1:
                return None
            candidate = ((kind_a, count_a), (kind_b, top))
            if self.capacity(candidate):
                return candidate
        return None

    def staircase(self, kind_a: str, kind_b: str, fewest_b: int, best_cost: float
                  ) -> PoolResult | None:
        """The cheapest passing mix with at least one of each kind, cheaper than `best_cost`
        (None: none). `fewest_b` instances of `kind_b` alone pass.

        Row by row (1, 2, ... of `kind_a`), the fewest `kind_b` that pass, bisected below the
        last row's count (which passes here too) and below the most that are still cheaper
        than the best so far; a row whose cheapest candidates fail is skipped."""
        best: PoolResult | None = None
        known = fewest_b  # (count_a, known) passes for every count_a from here on
        for count_a in range(1, self.max_counts[kind_a] + 1):
            top = self._row_top(kind_a, kind_b, count_a, known, best_cost)
            if top < 1:
                break

            def mix(count_b: int, count_a: int = count_a) -> Mix:
                return ((kind_a, count_a), (kind_b, count_b))

            # Next: the next row's first run if this candidate fails (most do), the
            # bisection's first middle if it passes.
            after = self._first_run(kind_a, kind_b, known, best_cost, count_a + 1)
            self.prefetch((mix(top), 1.0), *([(after, 1.0)] if after else []),
                          *([(mix(top // 2), 1.0)] if top > 1 else []))
            if not self.judge(mix(top)).meets:
                continue
            known = self._fewest_passing(0, top, mix, ahead=True)  # 0: not a pair: "fails"
            best, best_cost = self.judge(mix(known)), self.cost(mix(known))
        return best

    def cheapest(self, singles: Mapping[str, PoolResult | None]) -> PoolResult | None:
        """The cheapest pool of one or two kinds (None: no kind meets the targets)."""
        found = [r for r in singles.values() if r is not None]
        if not found:
            return None
        best = min(found, key=lambda r: self.cost(r.mix))
        best_cost = self.cost(best.mix)
        # One staircase per pair walks its whole frontier; it starts from a kind that meets
        # the targets alone (the one needing more instances: fewer rows to walk).
        pairs = []
        for a, b in itertools.combinations(self.kinds, 2):
            if singles.get(a) is None and singles.get(b) is None:
                continue
            if singles.get(b) is None or (singles.get(a) is not None and singles[a].num_instances
                                          > singles[b].num_instances):  # type: ignore[union-attr]
                a, b = b, a
            pairs.append((a, b))
        # Cheapest throughput first: good mixes early make the cost bound prune the rest.
        pairs.sort(key=lambda p: min(self.prices[k] / self.saturated[k] for k in p))
        for index, (kind_a, kind_b) in enumerate(pairs):
            fewest_b = singles[kind_b].num_instances  # type: ignore[union-attr]
            if index + 1 < len(pairs):  # the next pair's first run, if this one finds nothing
                next_a, next_b = pairs[index + 1]
                after = self._first_run(next_a, next_b, singles[next_b].num_instances,  # type: ignore[union-attr]
                                        best_cost, 1)
                self.prefetch(*([(after, 1.0)] if after else []))
            result = self.staircase(kind_a, kind_b, fewest_b, best_cost)
            if result is not None:
                best, best_cost = result, self.cost(result.mix)
        return best

    def headroom(self, mix: Mix) -> float:
        """The rate scale at which `mix` first misses a target: the lowest failing scale found,
        to `headroom_resolution` (`headroom_max` when even that passes)."""
        options = self.options
        low = high = 1.0
        for step in HEADROOM_STEPS:  # most plans are tight: look near 1 first
            high = min(options.headroom_max, step)
            # A failing step's bisection starts at the middle below it.
            self.prefetch((mix, high), (mix, (low + high) / 2))
            if not self.judge(mix, high).meets:
                break
            low = high
        else:
            return round(high, 3)
        while high - low > options.headroom_resolution + 1e-9:  # 1.1 - 1.05 > 0.05 in floats
            middle = (low + high) / 2
            self.prefetch((mix, middle), *[(mix, (a + b) / 2) for a, b in
                                           ((low, middle), (middle, high))
                                           if b - a > options.headroom_resolution + 1e-9])
            if self.judge(mix, middle).meets:
                low = middle
            else:
                high = middle
        return round(high, 3)


def judged_run(model: str, workload: Workload, rate: float, targets: Targets,
               members: Sequence[FleetMember], mix: Mix, scale: float, policy: str,
               options: PlanOptions, give_up: bool) -> PoolResult:
    """One verdict: the pool's run at `scale` x `rate` against its targets (module-level, so
    that a worker process can run it)."""
    run, num_requests = run_pool(
        workload, rate * scale, members, policy, options,
        abort_ttft_s=targets.ttft_p99_s if give_up else None,
        abort_e2e_s=targets.e2e_p99_s if give_up else None)
    meets = not run.aborted and targets.met_by(run.ttft_p99_s, run.e2e_p99_s)
    return PoolResult(model, mix, scale, run.ttft_p99_s, run.e2e_p99_s, meets, num_requests,
                      policy)


def run_pool(workload: Workload, rate: float, members: Sequence[FleetMember], policy: str,
             options: PlanOptions, abort_ttft_s: float | None = None,
             abort_e2e_s: float | None = None) -> tuple[RunResult, int]:
    """One model's pool replaying `workload` at `rate` (lengthened to at least
    `min_requests_per_instance` an instance and `min_requests_per_pool` in all) under
    `policy`: the run every verdict of the planner, and `scripts/bench_cluster.py
    --workload-file`, rest on. Also returns how many requests it replayed."""
    workload = lengthened(workload, max(options.min_requests_per_instance * len(members),
                                        options.min_requests_per_pool))
    setup = ClusterSetup.of_fleet(members, publish_interval_s=options.publish_interval_s,
                                  exec_noise_sigma=options.exec_noise_sigma,
                                  abort_ttft_s=abort_ttft_s, abort_e2e_s=abort_e2e_s)
    run = simulate(workload, rate, setup, policy, predictor_from_spec(options.predictor),
                   seed=options.seed)
    return run, len(workload)


def lengthened(workload: Workload, min_requests: int) -> Workload:
    """`workload` repeated back to back until it holds `min_requests` (the same rate)."""
    if len(workload) >= min_requests:
        return workload
    copies = math.ceil(min_requests / len(workload))
    period = workload.unit_arrival_s[-1] + 1.0
    arrivals = tuple(t + c * period for c in range(copies) for t in workload.unit_arrival_s)
    scale = (len(arrivals) - 1) / arrivals[-1] if arrivals[-1] > 0 else 1.0
    return Workload(workload.name, tuple(t * scale for t in arrivals),
                    workload.num_prompt_tokens * copies, workload.num_output_tokens * copies)


@dataclass(frozen=True, slots=True)
class _PoolPlan:
    """Everything planned for one model's pool (what a worker process sends back)."""

    best: PoolResult | None
    unmeetable: str
    singles: Mapping[str, PoolResult | None]
    headroom: float
    routing_blind: PoolResult | None
    saturated: Mapping[str, float]
    num_simulations: int


def _plan_pool(judge: PoolJudge, kind_order: tuple[str, ...],
               max_counts: Mapping[str, int | None]) -> _PoolPlan:
    """One model's pool: each kind alone, the cheapest of one or two kinds, its headroom and
    the routing-blind plan, each judged by simulation."""
    kinds = list(judge.kinds)
    blind_mix = routing_blind_mix(judge.workload, judge.rate, judge.kinds, judge.prices,
                                  max_counts, judge.lone_ok)
    blind = None if blind_mix is None else tuple(
        (k, blind_mix[k]) for k in kind_order if blind_mix.get(k, 0) > 0)
    if blind is not None:
        judge.prefetch_to_the_end(blind)
    if judge.runner.parallel:  # each kind's search waits on its own runs
        with ThreadPoolExecutor(len(kinds)) as threads:
            singles = dict(zip(kinds, threads.map(judge.fewest, kinds), strict=True))
    else:
        singles = {k: judge.fewest(k) for k in kinds}
    best = judge.cheapest(singles)
    if best is None:
        return _PoolPlan(None, _unmeetable(judge.model, judge), singles, math.nan, None,
                         judge.saturated, judge.num_simulations)
    headroom = judge.headroom(best.mix)
    blind_result = None if blind is None else judge.to_the_end(blind)
    return _PoolPlan(best, "", singles, headroom, blind_result, judge.saturated,
                     judge.num_simulations)


def plan_fleet(workload: PlanWorkload, targets: Mapping[str, Targets], catalog: Catalog,
               options: PlanOptions = PlanOptions(), rate_scale: float = 1.0,
               family_of: Mapping[str, str] | None = None,
               progress: Callable[[str], None] | None = None, jobs: int = 1) -> FleetPlan:
    """The cheapest fleet of `catalog`'s kinds meeting every model's `targets` on `workload` at
    `rate_scale` x its rate; its headroom and the alternatives (module docstring).

    `family_of` maps a workload's model name to its execution-time models' family (default:
    the name itself). With `jobs` above 1 the simulations run in that many worker processes
    (`runs.Runner`), the models' pools and their kinds searched at once; the plan is the same.
    Raises `PlanInputError` naming the model when one has no target, no execution-time model,
    or targets no fleet of the catalog meets (with the best figure reached and by which
    fleet).
    """
    family_of = dict(family_of or {})
    say = progress or (lambda _message: None)
    for model in workload.models:
        if model not in targets:
            raise PlanInputError(f"model {model!r} has no target: give --slo "
                                 f"{model}:ttft_p99=S[,e2e_p99=S]")
    kind_models: dict[tuple[str, str], KindModel] = {}
    notes: list[str] = []
    prices = {k.name: k.price_per_hour for k in catalog.kinds}
    max_counts = {k.name: k.max_count for k in catalog.kinds}
    kind_order = tuple(k.name for k in catalog.kinds)
    work = []
    for model in workload.models:
        family = family_of.get(model, model)
        kinds = {}
        for kind in catalog.kinds:
            try:
                kinds[kind.name] = kind_model(family, kind)
            except PlanInputError as exc:
                if "no execution-time model" in str(exc):
                    raise
                notes.append(f"{model}: {exc}")
        kind_models.update({(model, name): km for name, km in kinds.items()})
        prepared = _capped(workload.by_model[model], model, kinds)
        work.append((model, prepared, workload.rate_by_model[model] * rate_scale,
                     targets[model], kinds, prices, max_counts, options))
    say(f"planning {len(work)} pools on {len(kind_order)} GPU kinds")
    with Runner(jobs) as runner:
        def plan_pool(judge_args: tuple) -> _PoolPlan:
            return _plan_pool(PoolJudge(*judge_args, runner=runner), kind_order, max_counts)

        if runner.parallel:  # the pools are independent: each waits on its own runs
            with ThreadPoolExecutor(len(work)) as threads:
                planned = list(threads.map(plan_pool, work))
        else:
            planned = [plan_pool(item) for item in work]
    by_model = dict(zip(workload.models, planned, strict=True))
    for model, pool_plan in by_model.items():
        if pool_plan.best is None:
            raise PlanInputError(pool_plan.unmeetable)
        say(f"{model}: planned {_label(pool_plan.best.mix)} "
            f"({pool_plan.num_simulations} simulations)")
    pools = {m: p.best for m, p in by_model.items() if p.best is not None}
    headroom_by_model = {m: p.headroom for m, p in by_model.items()}

    def cost(pool: PoolResult) -> float:
        return sum(prices[k] * n for k, n in pool.mix)

    alternatives = []
    for kind in kind_order:
        chosen = {m: p.singles.get(kind) for m, p in by_model.items()}
        alternatives.append(Alternative(f"single:{kind}", chosen, sum(
            cost(r) for r in chosen.values() if r is not None)))
    blind = {m: p.routing_blind for m, p in by_model.items()}
    alternatives.append(Alternative("routing_blind", blind, sum(
        cost(r) for r in blind.values() if r is not None)))
    return FleetPlan(
        pools=pools, cost_per_hour=sum(cost(p) for p in pools.values()),
        headroom=min(headroom_by_model.values()), headroom_by_model=headroom_by_model,
        alternatives=tuple(alternatives), kind_models=kind_models,
        saturated_rps={(m, k): r for m, p in by_model.items() for k, r in p.saturated.items()},
        rate_scale=rate_scale, num_simulations=sum(p.num_simulations for p in planned),
        notes=tuple(notes))


def _capped(workload: Workload, model: str, kinds: Mapping[str, KindModel]) -> Workload:
    """The model's workload with outputs capped at the context (vLLM stops there); a prompt
    too long for the context is an input error."""
    if not kinds:
        raise PlanInputError(f"model {model!r}: no GPU kind of the catalog can hold it")
    max_len = min(k.config.max_model_len for k in kinds.values())
    too_long = [p for p in workload.num_prompt_tokens if p >= max_len]
    if too_long:
        raise PlanInputError(f"model {model!r}: {len(too_long)} prompts of {max_len} tokens or "
                             f"more (the longest {max(too_long)}): longer than the context "
                             f"the instances run with ({max_len})")
    outputs = tuple(max(1, min(o, max_len - p)) for p, o in
                    zip(workload.num_prompt_tokens, workload.num_output_tokens, strict=True))
    return Workload(workload.name, workload.unit_arrival_s, workload.num_prompt_tokens, outputs)


def _unmeetable(model: str, judge: PoolJudge) -> str:
    message = f"model {model!r}: no fleet of the catalog meets {judge.targets.describe()}"
    best = judge.closest_miss()
    if best is not None:
        return (f"{message}; the best reached ttft_p99 {best.ttft_p99_s:.3g} s, e2e_p99 "
                f"{best.e2e_p99_s:.3g} s with {_label(best.mix)}")
    lone = {k: _lone_p99(judge, k) for k in judge.kinds}
    kind, (ttft, e2e) = min(lone.items(), key=lambda i: judge.targets.shortfall(*i[1]))
    return (f"{message}; even alone on an idle {kind} (the fastest kind for it) its requests' "
            f"p99 is ttft {ttft:.3g} s, e2e {e2e:.3g} s")


def _lone_p99(judge: PoolJudge, kind: str) -> tuple[float, float]:
    model = judge.kinds[kind]
    pairs = [lone_latency(model, p, o) for p, o in zip(
        judge.workload.num_prompt_tokens, judge.workload.num_output_tokens, strict=True)]
    return (float(np.percentile([p[0] for p in pairs], 99)),
            float(np.percentile([p[1] for p in pairs], 99)))


def _label(mix: Mix) -> str:
    return " + ".join(f"{n} x {k}" for k, n in mix) or "no instance"
