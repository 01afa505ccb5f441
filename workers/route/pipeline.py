"""One routing decision, wherever it is made. Pure: no I/O, no clock of its own.

The route task, the API routing the held completions it accepts, and the cluster simulation
all call `decide_route`; each reads the inputs its own way (Redis, or the simulation's ledger)
and records the outcome its own way (PostgreSQL and the outbox, or the simulated instances).
The steps run in the order production has always applied them, as a chain in the manner of
llm-d's filter -> score -> pick plugins:

1. filter    the request's model's instances, alive and accepting;
2. fallback  while the bias watch's fallback is in force, its policy (llumnix: free room);
3. override  else the operator's run-time policy, else the pool's configured one (a pool of
             unlike hardware: the mixed-fleet policy);
4. budget    what is left of the request's latency targets at this moment;
5. plan      each candidate's view and what-if, and the policy's pick (`planner.plan_route`);
6. hold      late binding: no candidate would start the request soon, so it is held;
7. miss      a pick that meets no target is routed, demoted or refused, as its team says;
8. affinity  a session's next turn goes back to its previous instance while that has room.

Late binding's other half, which held requests to try and in what order, is
`late_binding.must_wait` and `late_binding.release`: both callers use them too.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from workers.route import affinity as session_affinity
from workers.route import targets
from workers.route.late_binding import LateBinding
from workers.route.planner import Candidate, Plan, plan_route
from workers.route.policies import POLICIES, RequestView, RoutingContext, needs_what_if
from workers.sim import ExecModel
from workers.sim.instance_status import routable

__all__ = ["FALLBACK_POLICY", "DecisionContext", "FleetRead", "RouteRequest", "Routed",
           "RoutingRules", "Unrouted", "decide_route", "policy_in_force"]

logger = logging.getLogger(__name__)

#: What routing falls back to while length predictions keep missing (the bias watch): a policy
#: that reads no predicted length and weights instances by their free room (KV blocks free
#: after the waiting requests' prompts, per running request), so an instance that has just
#: returned empty takes its share at once; round robin sent half a returned instance's backlog
#: back to the others (docs/operations.md).
FALLBACK_POLICY = "llumnix"
#: The policy that reads the fleet-wide round-robin ticket.
ROUND_ROBIN = "round_robin"


@dataclass(frozen=True, slots=True)
class RoutingRules:
    """The settings a decision reads (production: `Settings`, through the route stage)."""

    #: The configured policy of a pool of alike instances.
    policy: str
    #: The configured policy of a pool of unlike instances (`policy` when that was set).
    mixed_fleet_policy: str
    #: Late binding's rule (None: off).
    late_binding: LateBinding | None = None
    #: A request held this long is routed to the policy's pick, startable or not (s).
    hold_max_s: float = 30.0
    #: A refusing team refuses only misses beyond this share of the target.
    refuse_margin: float = 0.0
    #: Session affinity: how much slower (a share) the previous instance may be.
    affinity_margin: float = 0.2

    @classmethod
    def of_policy(cls, policy: str, **rules: Any) -> RoutingRules:
        """Rules that route every pool with `policy` (a benchmark comparing policies)."""
        return cls(policy, policy, **rules)


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """The request being routed, as the decision reads it."""

    view: RequestView
    #: The served model it asked for (None: a request stored before models were recorded).
    model: str | None = None
    targets: targets.RequestTargets | None = None
    #: Its first routing (a request re-routed from a lost instance is never refused).
    first_routing: bool = True
    #: It belongs to a session with affinity on; `preferred`: the session's last instance.
    session: bool = False
    preferred: str | None = None
    #: When it was first held (late binding), if it is being released.
    held_since: float | None = None


@dataclass(frozen=True, slots=True)
class FleetRead:
    """The fleet as one decision read it."""

    candidates: Sequence[Candidate]
    #: The operator's run-time policy override, if any.
    override: str | None = None
    #: The bias watch's fallback in force ({reason, model, ...}), if any.
    fallback: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class DecisionContext:
    """What the caller lends a decision: its clock, chance, the round-robin counter of each
    model's pool (`next_ticket(model)`, drawn only under round robin) and the execution-time
    models (asked only when the policy simulates).

    NOTE: a counter per model, not one for the fleet: with one, another model's requests took
    tickets in between, and two instances of a model saw them in a random order, not in turn
    (the planner simulates each pool alone, in turn: docs/plan_live.md)."""

    now: float
    rng: random.Random
    next_ticket: Callable[[str], int]
    exec_models: Callable[[Sequence[Candidate]], ExecModel | Mapping[str, ExecModel]]


class Unrouted(enum.Enum):
    """A decision that chose no instance."""

    NO_INSTANCE = "no_instance"  # none of the request's model is up and accepting
    HELD = "held"  # late binding holds it: no instance would start it soon


@dataclass(frozen=True, slots=True)
class Routed:
    """A decision: the plan (on the session's previous instance when affinity applied), what
    the targets made of it, and the fallback it was taken under."""

    plan: Plan
    #: The request's view as planned (its targets budgeted).
    view: RequestView
    miss: targets.Miss | None
    affinity: session_affinity.Affinity | None
    fallback: Mapping[str, Any] | None

    @property
    def instance_id(self) -> str:
        return self.plan.decision.instance_id

    @property
    def refused(self) -> bool:
        return self.miss is not None and self.miss.action is targets.SloMissAction.REFUSE

    @property
    def demoted(self) -> bool:
        """Its targets are out of reach and its team runs such requests as batch work."""
        return self.miss is not None and self.miss.action is targets.SloMissAction.QUEUE


def decide_route(request: RouteRequest, fleet: FleetRead, rules: RoutingRules,
                 ctx: DecisionContext) -> Routed | Unrouted:
    """The decision, step by step (see the module's docstring)."""
    candidates = routable(fleet.candidates, request.model)  # 1: filter
    if not candidates:
        return Unrouted.NO_INSTANCE
    policy = (FALLBACK_POLICY if fleet.fallback
              else policy_in_force(fleet.override, rules, candidates))
    view = targets.budgeted(request.view, request.targets, datetime.fromtimestamp(ctx.now, UTC))
    ticket = ctx.next_ticket(request.model or "") if policy == ROUND_ROBIN else 0
    plan = plan_route(policy, view, candidates, RoutingContext(ticket=ticket, rng=ctx.rng),
                      ctx.exec_models(candidates) if needs_what_if(policy) else None,
                      now=ctx.now, late_binding=_hold_rule(rules, request, ctx.now))
    if plan.startable is not None and not plan.startable:
        return Unrouted.HELD
    miss = targets.on_miss(plan, view, request.targets, first_routing=request.first_routing,
                           refuse_margin=rules.refuse_margin)
    plan, affinity = _with_affinity(plan, view, request, miss, rules)
    return Routed(plan, view, miss, affinity, fleet.fallback)


def policy_in_force(override: str | None, rules: RoutingRules,
                    candidates: Sequence[Candidate] = ()) -> str:
    """Step 3: the operator's override (an unknown name is ignored, loudly), else the configured
    policy of the candidates' pool: mixed when their published hardware differs."""
    hardware = {c.hardware for c in candidates if c.hardware is not None}
    configured = rules.mixed_fleet_policy if len(hardware) > 1 else rules.policy
    if override is None:
        return configured
    if override not in POLICIES.names():
        logger.error("ignoring unknown routing policy override %r", override)
        return configured
    return override


def _hold_rule(rules: RoutingRules, request: RouteRequest, now: float) -> LateBinding | None:
    """Step 6's rule: late binding's, unless the request has been held `hold_max_s`."""
    if rules.late_binding is None or (
            request.held_since is not None and now - request.held_since >= rules.hold_max_s):
        return None
    return rules.late_binding


def _with_affinity(plan: Plan, view: RequestView, request: RouteRequest,
                   miss: targets.Miss | None, rules: RoutingRules
                   ) -> tuple[Plan, session_affinity.Affinity | None]:
    """Step 8: the plan moved to the session's previous instance while it has room (never for
    a request being refused)."""
    if not request.session or (miss is not None
                               and miss.action is targets.SloMissAction.REFUSE):
        return plan, None
    affinity = session_affinity.prefer(plan.decision, plan.what_ifs, view, request.preferred,
                                       margin=rules.affinity_margin)
    if affinity.instance_id != plan.decision.instance_id:
        plan = dataclasses.replace(plan, decision=dataclasses.replace(
            plan.decision, instance_id=affinity.instance_id))
    return plan, affinity
