"""The route stage's logic: published fleet states -> policy views (with what-ifs) -> decision.

Pure (part of the core): the route task fetches the states from Redis and records the decision;
everything in between is here, testable on built states without a broker.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from workers.route.late_binding import LateBinding
from workers.route.policies import (
    Decision,
    RequestView,
    RoutingContext,
    credit_prefix,
    decide,
    instance_view,
    needs_what_if,
    prepare_published,
    probed,
)
from workers.sim import ExecModel, SimRequest, engine_priority, predict_what_if_prepared
from workers.sim.fleet_state import InstanceStatus
from workers.sim.snapshot import prefix_unit_hashes

__all__ = ["Plan", "plan_route"]


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
    candidates: Sequence[InstanceStatus],
    ctx: RoutingContext,
    exec_model: ExecModel | Mapping[str, ExecModel] | None,
    now: float | None = None,
    late_binding: LateBinding | None = None,
) -> Plan:
    """Decide among `candidates` (alive and accepting) with the named policy.

    `exec_model`: one execution-time model for every instance, or one per instance id.
    `now`: time.time() of the decision (default: the clock's), the new request's arrival in
    the priority an instance scheduling by priority gives it. With `late_binding` the plan
    says which candidates would start the request soon (`LateBinding.would_start`).

    With the request's prompt token ids, each instance publishing a prefix cache is credited
    the request's leading prompt units it holds (or will, for the requests routed to it since):
    its view's ``prefix_match_tokens``, and the what-if starts with them cached.
    """
    now = time.time() if now is None else now
    simulate = needs_what_if(policy_name)
    if simulate and exec_model is None:
        raise ValueError(f"policy {policy_name!r} needs an execution-time model")
    new_request = _waiting(request.request_id, request.num_prompt_tokens,
                           request.predicted_output_tokens)
    views = []
    startable: set[str] = set()
    what_ifs: dict[str, tuple[float, float]] = {}
    hashes_by_unit: dict[int, tuple[int, ...]] = {}  # the prompt's unit hashes, per unit size
    for status in probed(policy_name, sorted(candidates, key=lambda c: c.instance_id), ctx.rng):
        assert status.state is not None, f"{status.instance_id} has published no state"
        snapshot = status.state.to_instance_snapshot()
        # NOTE: a redelivered predict may route a request another run has just assigned: its
        # own entry is not load to weigh it against (the decision's UPDATE lets one run win).
        assigned = [a.to_sim_request(snapshot.config) for a in status.assigned
                    if a.request_id != request.request_id]
        what_if = None
        target = new_request
        if request.prompt_token_ids and snapshot.config.enable_prefix_caching:
            unit = snapshot.config.prefix_unit_tokens
            if unit not in hashes_by_unit:
                hashes_by_unit[unit] = prefix_unit_hashes(request.prompt_token_ids, unit)
            target = credit_prefix(dataclasses.replace(
                new_request, prefix_hashes=hashes_by_unit[unit]), snapshot, assigned)
        if simulate:
            assert exec_model is not None
            model = exec_model if isinstance(exec_model, ExecModel) else exec_model[
                status.instance_id]
            prepared = prepare_published(snapshot, assigned)
            if snapshot.config.is_priority:
                target = dataclasses.replace(target, priority=engine_priority(
                    request.priority_class, now, request.predicted_output_tokens,
                    snapshot.config.priority_ms_per_token))
            what_if = predict_what_if_prepared(prepared, target, model, status.future_load)
            what_ifs[status.instance_id] = (what_if.ttft_s, what_if.e2e_s)
        view = instance_view(status.instance_id, snapshot, assigned, what_if,
                             prefix_match_tokens=target.num_cached_tokens,
                             throughput_rps=status.state.capacity_rps)
        if late_binding is not None and late_binding.would_start(
                view, request.num_prompt_tokens, snapshot.config):
            startable.add(status.instance_id)
        views.append(view)
    return Plan(decide(policy_name, request, views, ctx), what_ifs,
                None if late_binding is None else frozenset(startable))


def _waiting(request_id: str, num_prompt_tokens: int, predicted: int | None) -> SimRequest:
    return SimRequest(
        request_id=request_id,
        num_prompt_tokens=num_prompt_tokens,
        num_computed_tokens=0,
        num_output_tokens=0,
        predicted_output_tokens=predicted,
        is_running=False,
    )

