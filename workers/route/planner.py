"""The plan step of a routing decision: each candidate's view (and what-if) -> the policy's pick.

Pure (part of the core). A candidate is an instance as a decision reads it (`Candidate`):
production reads `InstanceStatus`es from Redis, the cluster simulation its `FleetLedger`'s
entries; both give their published state and the requests routed since as a `Published`, and
the views are built in one place (`policies.view_of`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from workers.route.late_binding import LateBinding
from workers.route.policies import (
    Decision,
    InstanceView,
    RequestView,
    RoutingContext,
    decide,
    needs_what_if,
    probed,
    reads_state,
    view_of,
)
from workers.sim import ExecModel, SimRequest, engine_priority
from workers.sim.future_load import FutureLoad
from workers.sim.published import Published
from workers.sim.snapshot import InstanceConfig, prefix_unit_hashes

__all__ = ["Candidate", "Plan", "plan_route"]


class Candidate(Protocol):
    """One instance as a routing decision reads it."""

    @property
    def instance_id(self) -> str: ...

    @property
    def model(self) -> str | None: ...

    @property
    def routable(self) -> bool: ...

    @property
    def hardware(self) -> Hashable: ...

    @property
    def future_load(self) -> FutureLoad: ...

    def published(self) -> Published: ...


@dataclass(frozen=True, slots=True)
class Plan:
    decision: Decision
    # Simulated (ttft_s, e2e_s) of the request on each candidate, when the policy simulated.
    what_ifs: dict[str, tuple[float, float]]
    # With late binding: the candidates that would start the request soon (empty: hold it).
    startable: frozenset[str] | None = None


def plan_route(
    policy_name: str,
    request: RequestView,
    candidates: Sequence[Candidate],
    ctx: RoutingContext,
    exec_model: ExecModel | Mapping[str, ExecModel] | None,
    now: float | None = None,
    late_binding: LateBinding | None = None,
) -> Plan:
    """Decide among `candidates` (alive and accepting) with the named policy.

    `exec_model`: one execution-time model for every instance, or one per instance id.
    `now`: the decision's moment (default: time.time()), the new request's arrival in the
    priority an instance scheduling by priority gives it. With `late_binding` the plan says
    which candidates would start the request soon (`LateBinding.would_start`).

    With the request's prefix hashes (or its prompt token ids, hashed here per prefix unit),
    each instance is credited the request's leading prompt units its cache holds (or will, for
    the requests routed to it since): its view's ``prefix_match_tokens``, and the what-if
    starts with them cached.
    """
    if late_binding is None and not reads_state(policy_name):
        # NOTE: no state is read: building every candidate's view (one per instance, from its
        # published state and the requests routed since) would cost most of the decision.
        return Plan(decide(policy_name, request, [_unread_view(c.instance_id)
                                                  for c in candidates], ctx), {})
    now = time.time() if now is None else now
    simulate = needs_what_if(policy_name)
    if simulate and exec_model is None:
        raise ValueError(f"policy {policy_name!r} needs an execution-time model")
    views = []
    startable: set[str] = set()
    what_ifs: dict[str, tuple[float, float]] = {}
    hashes = _PrefixHashes(request)
    for candidate in probed(policy_name, sorted(candidates, key=lambda c: c.instance_id),
                            ctx.rng):
        # NOTE: a redelivered decision may route a request another run has just assigned: its
        # own entry is not load to weigh it against (the decision's UPDATE lets one run win).
        published = candidate.published().without(request.request_id)
        config = published.snapshot.config
        target = _waiting(request, hashes.of(config))
        model = None
        if simulate:
            assert exec_model is not None
            model = (exec_model if isinstance(exec_model, ExecModel)
                     else exec_model[candidate.instance_id])
            if config.is_priority:
                target = dataclasses.replace(target, priority=engine_priority(
                    request.priority_class, now, request.predicted_output_tokens,
                    config.priority_ms_per_token))
        view, what_if = view_of(candidate.instance_id, published, target, model,
                                candidate.future_load)
        if what_if is not None:
            what_ifs[candidate.instance_id] = (what_if.ttft_s, what_if.e2e_s)
        if late_binding is not None and late_binding.would_start(
                view, request.num_prompt_tokens, config):
            startable.add(candidate.instance_id)
        views.append(view)
    return Plan(decide(policy_name, request, views, ctx), what_ifs,
                None if late_binding is None else frozenset(startable))


def _unread_view(instance_id: str) -> InstanceView:
    """A candidate's view for a policy that reads no state: its id (the figures are zeros)."""
    return InstanceView(instance_id, 0, 0, 0, 0, 0)


class _PrefixHashes:
    """The request's prefix hashes for an instance's cache: given (the simulation's workloads
    carry them), or its prompt token ids hashed per prefix unit, once per unit size."""

    def __init__(self, request: RequestView) -> None:
        self._request = request
        self._by_unit: dict[int, tuple[int, ...]] = {}

    def of(self, config: InstanceConfig) -> tuple[int, ...]:
        request = self._request
        if not config.enable_prefix_caching:
            return ()
        if request.prefix_hashes is not None:
            return request.prefix_hashes
        if not request.prompt_token_ids:
            return ()
        unit = config.prefix_unit_tokens
        if unit not in self._by_unit:
            self._by_unit[unit] = prefix_unit_hashes(request.prompt_token_ids, unit)
        return self._by_unit[unit]


def _waiting(request: RequestView, prefix_hashes: tuple[int, ...]) -> SimRequest:
    return SimRequest(
        request_id=request.request_id,
        num_prompt_tokens=request.num_prompt_tokens,
        num_computed_tokens=0,
        num_output_tokens=0,
        predicted_output_tokens=request.predicted_output_tokens,
        is_running=False,
        prefix_hashes=prefix_hashes,
    )
