"""Routing policies: one decision each, registered by name. Pure: no I/O, no clock.

A policy scores the candidates (lower is better) and the lowest wins, ties broken at random, so
every decision can be recorded with all candidates' scores. Policies only read `InstanceView`
fields; what is expensive to know (a simulated what-if per instance) the caller computes first,
with `FleetLedger` or `predict_what_ifs` below, and passes in the views.

Names (the Block paper's in brackets): ``round_robin``, ``random``, ``least_requests``,
``infaas`` [INFaaS++], ``llumnix`` [Llumnix-], ``least_tokens`` [Block-NoSim], ``block``
[Block], ``block_ttft``, ``block_harm`` (block plus the delay it adds to the others),
``prefix_affinity`` (the prefix-cache-aware routers of vLLM's production stack, llm-d and
SGLang), and ``po2_<name>`` / ``po4_<name>`` [Po2/Po4] for every
scoring policy: k candidates drawn at random, the best of them by ``<name>``. The oracle mode
[Block*] is not a policy: it is the caller predicting lengths with the true ones.

Prefix caching: a request may carry its prompt's prefix hashes (`SimRequest.prefix_hashes`) and
an instance publishes the prefix units its cache holds (`InstanceSnapshot.cached_prefixes`); the
views then give each instance's match (`InstanceView.prefix_match_tokens`) and the what-ifs
credit it: the new request (and each request routed since the snapshot) starts with its matched
prefix cached (`credit_prefix`), as the engine's cache will serve it.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from workers.registry import Registry
from workers.sim import (
    ExecModel,
    InstanceSnapshot,
    PreparedInstance,
    SimRequest,
    WhatIf,
    predict_what_if_prepared,
    target_output_tokens,
)
from workers.sim.future_load import NO_FUTURE_LOAD, FutureLoad
from workers.sim.published import Published, credit_prefix, prepare_published

T = TypeVar("T")

__all__ = [
    "POLICIES",
    "PROBE_COUNTS",
    "SCORING_POLICIES",
    "Decision",
    "FleetLedger",
    "InstanceView",
    "Policy",
    "PowerOfK",
    "RequestView",
    "RoutingContext",
    "credit_prefix",
    "decide",
    "instance_view",
    "needs_what_if",
    "predict_what_ifs",
    "prepare_published",
    "reads_state",
    "target_shortfall",
    "view_of",
]


@dataclass(frozen=True, slots=True)
class RequestView:
    request_id: str
    num_prompt_tokens: int
    # The length the router plans with: a prediction, or the true length in oracle benchmarks.
    predicted_output_tokens: int | None
    max_tokens: int
    # The request's latency targets (seconds from now), if any: see `decide`.
    ttft_target_s: float | None = None
    e2e_target_s: float | None = None
    # The prompt's token ids, when instances run with prefix caching: the planner hashes them
    # (`workers.sim.snapshot.prefix_unit_hashes`) to find each instance's cached prefix.
    prompt_token_ids: tuple[int, ...] | None = None
    # The prompt's prefix hashes, already per prefix unit (the cluster simulation's workloads
    # carry them); None: hashed from `prompt_token_ids` when an instance caches prefixes.
    prefix_hashes: tuple[int, ...] | None = None
    # Its class (`Priority.rank`: 0 interactive, 1 batch): an engine with batch work in flight
    # schedules every interactive request first (`workers.sim.snapshot.engine_priority`).
    priority_class: int = 0

    @property
    def has_target(self) -> bool:
        return self.ttft_target_s is not None or self.e2e_target_s is not None


@dataclass(frozen=True, slots=True)
class InstanceView:
    instance_id: str
    num_running: int
    num_waiting: int
    # Routed here but not yet admitted by the engine (absent from the published state).
    num_assigned: int
    num_free_blocks: int
    num_total_blocks: int
    # KV blocks the waiting and assigned requests need to be admitted (their prompts, plus the
    # output a preempted request recomputes): Llumnix's "blocks of waiting requests".
    num_waiting_prompt_blocks: int = 0
    # Tokens still to compute over running, waiting and assigned requests: prompt tokens not yet
    # in the KV cache plus predicted output tokens not yet generated; None when not known.
    num_outstanding_tokens: int | None = None
    # Simulated time to first token of the request being routed, had this instance got it at its
    # published moment (seconds); None when the caller did not compute it.
    what_if_ttft_s: float | None = None
    # Simulated end-to-end latency of the request being routed, as above.
    what_if_e2e_s: float | None = None
    # Simulated delay the request would add to this instance's other requests, summed (s).
    what_if_delay_to_others_s: float | None = None
    # Prompt tokens of the request being routed this instance's prefix cache holds (by its
    # published cached prefixes and the requests routed to it since); 0 when unknown.
    prefix_match_tokens: int = 0
    # Simulated wait of the request being routed until this instance first schedules it (s).
    what_if_queueing_s: float | None = None
    # The instance's capacity: requests per second it completes with a full queue, as measured
    # or modelled for its hardware (`FleetLedger.set_throughput`); None when unknown.
    throughput_rps: float | None = None
    # Preemptions in the what-if's span (any request): KV exhaustion it runs into.
    what_if_preemptions: int | None = None
    # Tokens per KV block on this instance.
    block_size: int = 16

    @property
    def kv_usage(self) -> float:
        """Share of KV blocks in use (cached free blocks count as free, as vLLM counts them)."""
        return 1.0 - self.num_free_blocks / max(self.num_total_blocks, 1)


@dataclass(frozen=True, slots=True)
class RoutingContext:
    # A fleet-wide counter value drawn for this decision (round robin across router processes).
    ticket: int
    rng: random.Random


@dataclass(frozen=True, slots=True)
class Decision:
    policy: str
    instance_id: str
    # Score of every candidate the policy considered (lower is better); a power-of-k policy
    # considers only the instances it probed.
    scores: dict[str, float]
    # For a request with latency targets: whether the chosen instance's what-if meets them
    # (False: none did, the policy's own pick stands); None without targets or what-ifs.
    meets_target: bool | None = None


class Policy(Protocol):
    #: Whether the caller must fill ``what_if_ttft_s`` / ``what_if_e2e_s`` in the views.
    needs_what_if: ClassVar[bool]

    def scores(
        self, request: RequestView, fleet: Sequence[InstanceView], ctx: RoutingContext
    ) -> list[float | None]:
        """One score per instance of `fleet`, in order; the lowest wins; None: not a candidate."""
        ...


POLICIES: Registry[Policy] = Registry("routing policy")


@POLICIES.register("round_robin")
class RoundRobin:
    needs_what_if = False
    reads_state = False

    def scores(self, request, fleet, ctx):  # type: ignore[no-untyped-def]
        chosen = ctx.ticket % len(fleet)
        return [0.0 if i == chosen else 1.0 for i in range(len(fleet))]


@POLICIES.register("random")
class Random:
    needs_what_if = False
    reads_state = False

    def scores(self, request, fleet, ctx):  # type: ignore[no-untyped-def]
        # NOTE: all tie, so the tie break draws the winner uniformly.
        return [0.0] * len(fleet)


@POLICIES.register("least_requests")
class LeastRequests:
    needs_what_if = False

    def scores(self, request, fleet, ctx):  # type: ignore[no-untyped-def]
        return [float(i.num_running + i.num_waiting + i.num_assigned) for i in fleet]


@POLICIES.register("infaas")
class Infaas:
    """INFaaS++: most free KV blocks per running request (assigned ones will run too)."""

    needs_what_if = False

    def scores(self, request, fleet, ctx):  # type: ignore[no-untyped-def]
        return [-i.num_free_blocks / max(i.num_running + i.num_assigned, 1) for i in fleet]


@POLICIES.register("llumnix")
class Llumnix:
    """Llumnix-: freeness = (free blocks - blocks of waiting requests) / max(running, 1)."""

    needs_what_if = False

    def scores(self, request, fleet, ctx):  # type: ignore[no-untyped-def]
        return [-(i.num_free_blocks - i.num_waiting_prompt_blocks) / max(i.num_running, 1)
                for i in fleet]


@POLICIES.register("least_tokens")
class LeastTokens:
    """Block-NoSim: least outstanding predicted tokens."""

    needs_what_if = False

    def scores(self, request, fleet, ctx):  # type: ignore[no-untyped-def]
        return [float(_required(i, "num_outstanding_tokens", i.num_outstanding_tokens))
                for i in fleet]


@POLICIES.register("capacity_weighted")
class CapacityWeighted:
    """Least outstanding work per unit of capacity: the instance that drains soonest.

    The outstanding predicted tokens (`least_tokens`'s signal) with the new request's own
    added, divided by the instance's throughput (`InstanceView.throughput_rps`: what an operator
    configures as its weight, measured on the workload or modelled for its GPU), so that an
    instance twice as fast takes twice the backlog. Then Llumnix's KV headroom breaks the
    near-ties a fleet of equals produces: an instance whose free blocks, less those its
    waiting requests need, would not hold the new request scores as if its backlog were
    `KV_FULL_PENALTY` times longer (a fast GPU with a small cache fills it first). Without
    throughputs every instance weighs 1 (`least_tokens` with that KV guard).
    """

    needs_what_if = False
    #: Backlog factor of an instance whose KV cache would not hold the request now.
    KV_FULL_PENALTY: ClassVar[float] = 2.0

    def scores(self, request, fleet, ctx):  # type: ignore[no-untyped-def]
        own = request.num_prompt_tokens + (request.predicted_output_tokens or 0)
        scores = []
        for i in fleet:
            backlog = float(_required(i, "num_outstanding_tokens", i.num_outstanding_tokens)
                            + own)
            headroom = (i.num_free_blocks - i.num_waiting_prompt_blocks) * i.block_size
            if headroom < own:
                backlog *= self.KV_FULL_PENALTY
            scores.append(backlog / (i.throughput_rps or 1.0))
        return scores


@POLICIES.register("block")
class Block:
    """Block: minimum simulated end-to-end latency of the new request."""

    needs_what_if = True

    def scores(self, request, fleet, ctx):  # type: ignore[no-untyped-def]
        return [_required(i, "what_if_e2e_s", i.what_if_e2e_s) for i in fleet]


@POLICIES.register("block_affinity")
class BlockAffinity:
    """block, with the instance holding the request's longest cached prefix preferred while
    its simulated end-to-end latency is within `MARGIN` of the best.

    block scores the new request's own latency, and a cache hit shortens that by a prefill
    step or two: less than the load difference between instances, so a conversation's turns
    scatter and each instance recomputes them. The hit's value to the fleet (prefill work no
    instance does) is not in that score; the margin buys it. On multi-turn chats block's cache
    hits fall as load rises while prefix_affinity's hold (docs/benchmarks_cluster.md,
    docs/measurements.md).
    """

    needs_what_if = True
    #: The live router's session affinity uses the same margin (session_affinity_margin).
    MARGIN: ClassVar[float] = 0.2

    def scores(self, request, fleet, ctx):  # type: ignore[no-untyped-def]
        e2e = [_required(i, "what_if_e2e_s", i.what_if_e2e_s) for i in fleet]
        best = max((i.prefix_match_tokens for i in fleet), default=0)
        if best <= 0:
            return e2e
        return [t / (1.0 + self.MARGIN) if i.prefix_match_tokens == best else t
                for i, t in zip(fleet, e2e, strict=True)]


@POLICIES.register("block_harm")
class BlockHarm:
    """Minimum latency added over everybody: the new request's simulated end-to-end latency
    plus the delay its steps add to the instance's other requests (`WhatIf.delay_to_others_s`,
    the rule `decide` applies among instances meeting a target). A measured alternative to
    block (docs/benchmarks_cluster.md, 2026-12-02): it preempts less but queues the new request
    where it delays nobody, and its TTFT p99 near capacity is worse."""

    needs_what_if = True

    def scores(self, request, fleet, ctx):  # type: ignore[no-untyped-def]
        return [_required(i, "what_if_e2e_s", i.what_if_e2e_s)
                + _required(i, "what_if_delay_to_others_s", i.what_if_delay_to_others_s)
                for i in fleet]


@POLICIES.register("block_ttft")
class BlockTtft:
    """Minimum simulated time to first token of the new request."""

    needs_what_if = True

    def scores(self, request, fleet, ctx):  # type: ignore[no-untyped-def]
        return [_required(i, "what_if_ttft_s", i.what_if_ttft_s) for i in fleet]


@POLICIES.register("block_slo")
class BlockSlo:
    """The first token, with the KV pressure the what-if runs into: simulated time to first
    token plus `PREEMPTION_S` for each preemption in the what-if's span.

    `block`'s end-to-end objective accepts seconds of queueing on a fast GPU for a long
    request, so a TTFT target fails; `block_ttft`'s sees nothing after the first token. On a
    fast GPU whose KV cache is no larger than a slow one's, it keeps admitting while blocks
    are free, the decodes outgrow the cache and vLLM preempts and recomputes, again and again
    (docs/benchmarks_cluster.md, docs/measurements.md). The what-if simulates those
    preemptions (`WhatIf.num_preemptions`: any request's, until the new one finishes); each
    counts as `PREEMPTION_S` of waiting, more than any TTFT difference between instances that
    are not overloaded, so that an instance whose cache holds the request wins.
    """

    needs_what_if = True
    #: Seconds each preemption in the what-if's span counts as (1 and 3 decide alike in the
    #: benchmark; 0.5, or adding a tenth of the end-to-end latency, preempts more).
    PREEMPTION_S: ClassVar[float] = 1.0

    def scores(self, request, fleet, ctx):  # type: ignore[no-untyped-def]
        return [_required(i, "what_if_ttft_s", i.what_if_ttft_s)
                + self.PREEMPTION_S * _required(i, "what_if_preemptions", i.what_if_preemptions)
                for i in fleet]


@POLICIES.register("prefix_affinity")
class PrefixAffinity:
    """The longest cached prefix wins unless its instance is saturated; else least load.

    As the peers' prefix-aware routers do it: llm-d's scheduler drops instances whose waiting
    queue or KV-cache usage is over a threshold before its prefix scorer, vLLM's production
    stack routes by longest prefix match, SGLang's cache-aware router routes to the best match
    unless the load is imbalanced. Saturated: more than `MAX_QUEUED` requests waiting (routed
    ones included) or KV usage above `MAX_KV_USAGE` (llm-d's defaults, 5 and 0.8). Among
    unsaturated instances with the longest match, fewest requests; with no match anywhere (or
    every matching instance saturated), fewest requests over all.
    """

    needs_what_if = False
    MAX_QUEUED: ClassVar[int] = 5
    MAX_KV_USAGE: ClassVar[float] = 0.8
    #: Added to the score of an instance without the best usable match.
    NOT_PREFERRED: ClassVar[float] = 1e6

    def scores(self, request, fleet, ctx):  # type: ignore[no-untyped-def]
        loads = [float(i.num_running + i.num_waiting + i.num_assigned) for i in fleet]
        open_ = [i.num_waiting + i.num_assigned <= self.MAX_QUEUED
                 and i.kv_usage <= self.MAX_KV_USAGE for i in fleet]
        best = max((i.prefix_match_tokens for i, ok in zip(fleet, open_, strict=True) if ok),
                   default=0)
        if best <= 0:
            return loads
        # NOTE: finite scores (decisions are stored as JSON): any other instance scores more
        # than every best-matching one.
        return [load if ok and i.prefix_match_tokens == best else load + self.NOT_PREFERRED
                for i, ok, load in zip(fleet, open_, loads, strict=True)]


def _required(view: InstanceView, field: str, value: float | None) -> float:
    if value is None:
        raise ValueError(f"{view.instance_id}: the caller must compute {field} for this policy "
                         f"(see FleetLedger.views)")
    return value


class PowerOfK:
    """Probe `num_probes` candidates drawn at random; the best of them by `inner` wins."""

    def __init__(self, inner: Policy, num_probes: int) -> None:
        if num_probes < 1:
            raise ValueError(f"num_probes must be positive, got {num_probes}")
        self.inner = inner
        self.num_probes = num_probes
        self.needs_what_if = inner.needs_what_if  # type: ignore[misc]

    def scores(self, request, fleet, ctx):  # type: ignore[no-untyped-def]
        probed = sorted(ctx.rng.sample(range(len(fleet)), min(self.num_probes, len(fleet))))
        inner_scores = self.inner.scores(request, [fleet[i] for i in probed], ctx)
        scores: list[float | None] = [None] * len(fleet)
        for index, score in zip(probed, inner_scores, strict=True):
            scores[index] = score
        return scores


#: Policies that rank instances by a load signal: each gets power-of-k variants.
SCORING_POLICIES = ("least_requests", "infaas", "llumnix", "least_tokens", "block", "block_ttft",
                    "block_slo", "capacity_weighted")
#: The k of the registered power-of-k variants (``po2_block``, ``po4_block``, ...).
PROBE_COUNTS = (2, 4)


def _register_power_of_k(num_probes: int, inner_name: str) -> None:
    class Probing(PowerOfK):
        def __init__(self) -> None:
            super().__init__(POLICIES.create(inner_name), num_probes)

    Probing.__name__ = Probing.__qualname__ = f"Po{num_probes}_{inner_name}"
    POLICIES.register(f"po{num_probes}_{inner_name}")(Probing)


for _k in PROBE_COUNTS:
    for _name in SCORING_POLICIES:
        _register_power_of_k(_k, _name)
del _k, _name


def probed(policy_name: str, candidates: Sequence[T], rng: random.Random) -> list[T]:
    """The candidates the named policy looks at: all of them, or, for a power-of-k policy, the
    k it probes, drawn here before anything is simulated (probing few is the point of it:
    simulating every instance and keeping k would cost as much as block itself)."""
    policy = POLICIES.create(policy_name)
    if not isinstance(policy, PowerOfK) or len(candidates) <= policy.num_probes:
        return list(candidates)
    return [candidates[i] for i in sorted(rng.sample(range(len(candidates)), policy.num_probes))]


def reads_state(policy_name: str) -> bool:
    """Whether the named policy reads the instances' states: False for those with a class
    attribute ``reads_state = False`` (round robin and random only count and order the
    candidates), whose callers need not build views from the states."""
    return bool(getattr(POLICIES.create(policy_name), "reads_state", True))


def needs_what_if(policy_name: str) -> bool:
    """Whether the named policy reads the what-if fields (so the caller must simulate)."""
    return bool(POLICIES.create(policy_name).needs_what_if)


def decide(
    policy_name: str, request: RequestView, fleet: Sequence[InstanceView], ctx: RoutingContext
) -> Decision:
    """Apply the named policy to a non-empty fleet (sorted by id for stable round robin).

    A request with latency targets, under a policy that simulates, goes to an instance whose
    what-if meets them, the one adding the least latency over all its requests (its own
    end-to-end plus the delay to the others; then the policy's score, then chance, on ties);
    when none meets them, to the instance closest to them (the least worst what-if / target
    ratio, `target_shortfall`; then the policy's score, then chance) and the decision says so
    (`meets_target` False) for the caller to act on. Without what-ifs targets are not read.
    The route stage and the cluster simulation both decide here: the same rule for both.
    """
    if not fleet:
        raise ValueError("no candidate instances")
    ordered = sorted(fleet, key=lambda i: i.instance_id)
    scores = POLICIES.create(policy_name).scores(request, ordered, ctx)
    considered = {inst.instance_id: s for inst, s in zip(ordered, scores, strict=True)
                  if s is not None}
    assert considered, f"{policy_name} considered no instance"
    if request.has_target and all(i.what_if_ttft_s is not None for i in ordered
                                  if i.instance_id in considered):
        feasible = [i for i in ordered if i.instance_id in considered and _meets(request, i)]
        if feasible:
            # The latency it adds over everybody: its own plus the delay to the others (a
            # request that would only wait somewhere delays nobody there, but is slow itself).
            harm = {i.instance_id: ((i.what_if_delay_to_others_s or 0.0) + (i.what_if_e2e_s or 0.0),
                                    considered[i.instance_id]) for i in feasible}
            return Decision(policy_name, _lowest(harm, ctx), considered, meets_target=True)
        closest = {i.instance_id: (_shortfall(request, i), considered[i.instance_id])
                   for i in ordered if i.instance_id in considered}
        return Decision(policy_name, _lowest(closest, ctx), considered, meets_target=False)
    return Decision(policy=policy_name, instance_id=_lowest(considered, ctx), scores=considered)


def target_shortfall(request: RequestView, fleet: Sequence[InstanceView]) -> float | None:
    """How far the best instance's what-if is from the request's targets: the smallest, over
    `fleet`, of the largest what-if / target ratio (1 or less: met); None without targets or
    what-ifs. A caller refusing requests can keep a margin for the what-if's own error."""
    if not request.has_target or any(v.what_if_ttft_s is None for v in fleet) or not fleet:
        return None
    return min(_shortfall(request, v) for v in fleet)


def _shortfall(request: RequestView, view: InstanceView) -> float:
    """The instance's largest what-if / target ratio over the request's targets (1 or less:
    met); its what-ifs must be set."""
    ttft, e2e = request.ttft_target_s, request.e2e_target_s
    return max(view.what_if_ttft_s / ttft if ttft else 0.0,  # type: ignore[operator]
               view.what_if_e2e_s / e2e if e2e else 0.0)  # type: ignore[operator]


def _meets(request: RequestView, view: InstanceView) -> bool:
    """Whether the instance's what-if meets every target the request has."""
    ttft, e2e = request.ttft_target_s, request.e2e_target_s
    return ((ttft is None or (view.what_if_ttft_s is not None and view.what_if_ttft_s <= ttft))
            and (e2e is None or (view.what_if_e2e_s is not None and view.what_if_e2e_s <= e2e)))


def _lowest(keys: Mapping[str, Any], ctx: RoutingContext) -> str:
    """The id with the lowest key; chance among equals."""
    best = min(keys.values())
    return ctx.rng.choice([instance_id for instance_id, key in keys.items() if key == best])


# -- inputs the caller computes: views and what-ifs from published states ---------------------

def predict_what_ifs(request: SimRequest, instances: Mapping[str, PreparedInstance],
                     exec_model: ExecModel) -> dict[str, WhatIf]:
    """The new request's simulated timeline on each instance, from its published moment.

    `request` carries the length to plan with in ``predicted_output_tokens`` (the prediction,
    or the true length in oracle benchmarks). One call per instance of `instances`.
    """
    return {instance_id: predict_what_if_prepared(instance, request, exec_model)
            for instance_id, instance in instances.items()}


def instance_view(instance_id: str, snapshot: InstanceSnapshot,
                  assigned: Sequence[SimRequest] = (),
                  what_if: WhatIf | None = None,
                  prefix_match_tokens: int = 0,
                  throughput_rps: float | None = None) -> InstanceView:
    """The view policies read, from a published snapshot and the requests routed since."""
    waiting_blocks, outstanding = _load_of(snapshot.requests, snapshot)
    assigned_blocks, assigned_outstanding = _load_of(assigned, snapshot)
    num_running = sum(1 for r in snapshot.requests if r.is_running)
    return InstanceView(
        instance_id=instance_id,
        num_running=num_running,
        num_waiting=len(snapshot.requests) - num_running,
        num_assigned=len(assigned),
        num_free_blocks=snapshot.num_free_blocks,
        num_total_blocks=snapshot.config.num_total_blocks,
        num_waiting_prompt_blocks=waiting_blocks + assigned_blocks,
        num_outstanding_tokens=outstanding + assigned_outstanding,
        what_if_ttft_s=None if what_if is None else what_if.ttft_s,
        what_if_e2e_s=None if what_if is None else what_if.e2e_s,
        what_if_delay_to_others_s=None if what_if is None else what_if.delay_to_others_s,
        prefix_match_tokens=prefix_match_tokens,
        what_if_queueing_s=None if what_if is None else what_if.queueing_s,
        throughput_rps=throughput_rps,
        what_if_preemptions=None if what_if is None else what_if.num_preemptions,
        block_size=snapshot.config.block_size,
    )


def _load_of(requests: Iterable[SimRequest], snapshot: InstanceSnapshot) -> tuple[int, int]:
    """(blocks the waiting ones need to be admitted, outstanding tokens) of `requests`."""
    config = snapshot.config
    block_size = config.block_size
    waiting_blocks = outstanding = 0
    for r in requests:
        num_tokens = r.num_prompt_tokens + r.num_output_tokens
        computed = min(r.num_computed_tokens, num_tokens) if r.is_running else 0
        if not r.is_running:
            waiting_blocks += -(-num_tokens // block_size)
        remaining_output = target_output_tokens(r, config) - r.num_output_tokens
        outstanding += num_tokens - computed + remaining_output
    return waiting_blocks, outstanding


class FleetLedger:
    """What a router knows: each instance's latest published state and what it routed since.

    The caller publishes snapshots as they arrive and records every assignment; `candidates`
    then gives each instance as the routing planner reads it (`workers.route.planner`), and
    `views` each instance's view with the assignments made since its snapshot counted in, with
    what-ifs simulated when an `exec_model` is given. Pure bookkeeping, no clock: times are
    the caller's.
    """

    def __init__(self) -> None:
        self._instances: dict[str, _Entry] = {}
        self._throughput: dict[str, float] = {}

    def set_throughput(self, instance_id: str, requests_per_s: float) -> None:
        """The instance's capacity (`InstanceView.throughput_rps`), kept across publications."""
        self._throughput[instance_id] = requests_per_s
        if instance_id in self._instances:
            self._instances[instance_id].changed()

    def publish(self, instance_id: str, snapshot: InstanceSnapshot, published_at_s: float) -> None:
        """Replace `instance_id`'s state; assignments the snapshot already shows are dropped.

        A request shows if it is in the snapshot, or was routed at or before the snapshot
        moment (the engine had it then: it may already have finished).
        """
        old = self._instances.get(instance_id)
        shown = frozenset(r.request_id for r in snapshot.requests)
        assigned: list[tuple[SimRequest, float]] = []
        if old is not None:
            assigned = [(r, at) for r, at in old.assigned
                        if at > published_at_s and r.request_id not in shown]
        self._instances[instance_id] = _Entry(self, instance_id, snapshot, published_at_s,
                                              shown, assigned)

    def assign(self, instance_id: str, request: SimRequest, assigned_at_s: float) -> None:
        """Record that `request` (waiting, with the length planned with) was routed here at
        `assigned_at_s`; a note the instance's snapshot already covers is dropped, as `publish`
        judges: one older than the snapshot, or of a request the snapshot shows (a note written
        late, after a publication that saw the request: several routers, `decision_s`)."""
        entry = self._entry(instance_id)
        if assigned_at_s < entry.published_at_s or request.request_id in entry.shown:
            return
        entry.assigned.append((request, assigned_at_s))
        entry.changed()

    def assigned(self, instance_id: str) -> tuple[SimRequest, ...]:
        """Requests routed to `instance_id` that its latest snapshot does not show yet."""
        return tuple(r for r, _ in self._entry(instance_id).assigned)

    def prepared(self, instance_id: str) -> PreparedInstance:
        """The published state plus assignments since, normalised for what-ifs (cached)."""
        return self._entry(instance_id).published().prepared()

    def published(self, instance_id: str) -> Published:
        """The instance as a router knows it now (kept until it publishes or is routed to)."""
        return self._entry(instance_id).published()

    @property
    def instance_ids(self) -> list[str]:
        return list(self._instances)

    def views(self, request: SimRequest | None = None,
              exec_model: ExecModel | Mapping[str, ExecModel] | None = None,
              instance_ids: Sequence[str] | None = None) -> list[InstanceView]:
        """The views of `instance_ids` (default every instance); with what-ifs for `request`
        when `exec_model` is given: one execution-time model for every instance, or one per
        instance id (a fleet of unlike GPUs)."""
        if exec_model is not None and request is None:
            raise ValueError("what-ifs need the request being routed")
        views = []
        for instance_id in self._instances if instance_ids is None else instance_ids:
            model = (exec_model if exec_model is None or isinstance(exec_model, ExecModel)
                     else exec_model[instance_id])
            view, _ = view_of(instance_id, self.published(instance_id), request, model)
            views.append(view)
        return views

    def _entry(self, instance_id: str) -> _Entry:
        try:
            return self._instances[instance_id]
        except KeyError:
            raise ValueError(f"instance {instance_id!r} has published no state") from None


@dataclass(slots=True)
class _Entry:
    ledger: FleetLedger
    instance_id: str
    snapshot: InstanceSnapshot
    published_at_s: float
    # The requests the snapshot shows.
    shown: frozenset[str]
    # Routed here since the snapshot, in routing order, with their routing times.
    assigned: list[tuple[SimRequest, float]]
    _published: Published | None = None
    #: The snapshot alone, prepared, kept while requests are routed here (`Published`).
    _snapshot_prepared: PreparedInstance | None = None

    def published(self) -> Published:
        if self._published is None:
            self._published = Published(self.snapshot, tuple(r for r, _ in self.assigned),
                                        self.ledger._throughput.get(self.instance_id),
                                        self._snapshot_prepared)
        return self._published

    def changed(self) -> None:
        if self._published is not None:
            self._snapshot_prepared = self._published.snapshot_prepared
        self._published = None


def view_of(instance_id: str, published: Published, request: SimRequest | None = None,
            exec_model: ExecModel | None = None, future_load: FutureLoad = NO_FUTURE_LOAD,
            ) -> tuple[InstanceView, WhatIf | None]:
    """One instance's view for routing `request` (waiting, with the length to plan with), and
    its what-if when `exec_model` is given: the one place views are built, for the route
    stage's planner and the cluster simulation alike.

    The request's prefix hashes (if any) are credited against the instance's cache; the
    what-if starts with them cached and adds `future_load`."""
    if published.base_view is None:
        published.base_view = instance_view(instance_id, published.snapshot, published.assigned,
                                            throughput_rps=published.capacity_rps)
    view: InstanceView = published.base_view
    if request is None:
        return view, None
    planned = published.credit(request) if request.prefix_hashes else request
    if planned.num_cached_tokens:
        view = _with_match_view(view, planned.num_cached_tokens)
    if exec_model is None:
        return view, None
    what_if = predict_what_if_prepared(published.prepared(), planned, exec_model, future_load)
    return _with_what_if(view, what_if), what_if


def _with_what_if(view: InstanceView, what_if: WhatIf) -> InstanceView:
    # NOTE: positional, not dataclasses.replace: this runs once per instance per decision.
    return InstanceView(view.instance_id, view.num_running, view.num_waiting, view.num_assigned,
                        view.num_free_blocks, view.num_total_blocks,
                        view.num_waiting_prompt_blocks, view.num_outstanding_tokens,
                        what_if.ttft_s, what_if.e2e_s, what_if.delay_to_others_s,
                        view.prefix_match_tokens, what_if.queueing_s, view.throughput_rps,
                        what_if.num_preemptions, view.block_size)


def _with_match_view(view: InstanceView, match: int) -> InstanceView:
    return InstanceView(view.instance_id, view.num_running, view.num_waiting, view.num_assigned,
                        view.num_free_blocks, view.num_total_blocks,
                        view.num_waiting_prompt_blocks, view.num_outstanding_tokens,
                        view.what_if_ttft_s, view.what_if_e2e_s,
                        view.what_if_delay_to_others_s, match, view.what_if_queueing_s,
                        view.throughput_rps, view.what_if_preemptions, view.block_size)
