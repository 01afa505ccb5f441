"""Latency targets at routing: a request's targets as budgets for the decision, and what its
team's `slo_miss_action` makes of a decision that meets none of them.

Pure (part of the core): the decision pipeline (`workers.route.pipeline`) budgets the request
before it plans and asks `on_miss` after; domain/slo.py takes the targets from the API.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from datetime import datetime

from workers.route.planner import Plan
from workers.route.policies import RequestView

__all__ = ["Miss", "RequestTargets", "SloMissAction", "budgeted", "on_miss", "MAX_RETRY_AFTER_S"]

#: The longest wait a refused request is told before retrying.
MAX_RETRY_AFTER_S = 60


class SloMissAction(enum.StrEnum):
    """What happens to a request with targets no instance can meet (per team)."""

    ROUTE = "route"  # route it anyway, to the instance closest to its targets
    QUEUE = "queue"  # route it there as batch work: it runs after interactive requests
    REFUSE = "refuse"  # refuse it: it ends `rejected`, with when to retry


@dataclass(frozen=True, slots=True)
class RequestTargets:
    """A request's targets, as the router reads them."""

    ttft_ms: float | None
    e2e_ms: float | None
    miss_action: SloMissAction
    created_at: datetime

    @classmethod
    def of(cls, ttft_ms: float | None, e2e_ms: float | None, miss_action: str | None,
           created_at: datetime) -> RequestTargets | None:
        """From a request's columns; None without a target."""
        if ttft_ms is None and e2e_ms is None:
            return None
        return cls(ttft_ms, e2e_ms, SloMissAction(miss_action or SloMissAction.ROUTE),
                   created_at)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The targets it has: "ttft", "e2e" or both."""
        return tuple(kind for kind, target in (("ttft", self.ttft_ms), ("e2e", self.e2e_ms))
                     if target is not None)

    def budgets_s(self, now: datetime) -> tuple[float | None, float | None]:
        """(TTFT, e2e) targets in seconds from `now`: what is left of each since acceptance
        (at least a millisecond: a target already past is still one, and unmeetable)."""
        waited_s = (now - self.created_at).total_seconds()

        def left(target_ms: float | None) -> float | None:
            return None if target_ms is None else max(target_ms / 1000 - waited_s, 0.001)

        return left(self.ttft_ms), left(self.e2e_ms)


@dataclass(frozen=True, slots=True)
class Miss:
    """No candidate's what-if met the request's targets."""

    action: SloMissAction  # what the team's setting makes of it for this routing
    # The instance closest to the targets: the least worst what-if / target ratio.
    instance_id: str
    shortfall: float  # that ratio (above 1: missed)
    ttft_s: float  # its what-if, seconds from the decision
    e2e_s: float
    # Seconds after which a retry may fit: how far its what-if runs past the targets.
    retry_after_s: int

    def record(self) -> dict[str, object]:
        """What the request's routing record keeps of the miss."""
        return {"met": False, "action": str(self.action), "closest": self.instance_id,
                "shortfall": round(self.shortfall, 3), "retry_after_s": self.retry_after_s}


def budgeted(view: RequestView, targets: RequestTargets | None, now: datetime) -> RequestView:
    """The request's view with what is left of its targets at `now` (unchanged without)."""
    if targets is None:
        return view
    ttft_s, e2e_s = targets.budgets_s(now)
    return dataclasses.replace(view, ttft_target_s=ttft_s, e2e_target_s=e2e_s)


def on_miss(plan: Plan, view: RequestView, targets: RequestTargets | None, *,
            first_routing: bool, refuse_margin: float) -> Miss | None:
    """What to do about the plan's decision: None when it meets the targets, or they were
    not read (no target, or a policy that does not simulate).

    A request is refused or demoted only at its first routing (one re-routed from a lost
    instance was accepted and started: it is routed), and refused only when even the closest
    instance misses by more than `refuse_margin` (a share of the target, for the what-if's own
    error); within the margin it is routed there.
    """
    if targets is None or plan.decision.meets_target is not False or not plan.what_ifs:
        return None
    # NOTE: `decide` already chose the instance closest to the targets when none meets them:
    # the rule lives in one place.
    closest = plan.decision.instance_id
    ttft_s, e2e_s = plan.what_ifs[closest]
    ratio = _ratio(view, ttft_s, e2e_s)
    action = targets.miss_action if first_routing else SloMissAction.ROUTE
    if action is SloMissAction.REFUSE and ratio <= 1.0 + refuse_margin:
        action = SloMissAction.ROUTE
    return Miss(action, closest, ratio, ttft_s, e2e_s, _retry_after_s(view, ttft_s, e2e_s))


def _ratio(view: RequestView, ttft_s: float, e2e_s: float) -> float:
    """The worse of what-if / target over the request's targets."""
    return max(ttft_s / view.ttft_target_s if view.ttft_target_s else 0.0,
               e2e_s / view.e2e_target_s if view.e2e_target_s else 0.0)


def _retry_after_s(view: RequestView, ttft_s: float, e2e_s: float) -> int:
    """How far the closest what-if runs past the targets, in whole seconds (1 to
    MAX_RETRY_AFTER_S): the backlog ahead of it drains about that much meanwhile."""
    over = max(ttft_s - view.ttft_target_s if view.ttft_target_s else 0.0,
               e2e_s - view.e2e_target_s if view.e2e_target_s else 0.0)
    return min(max(1, math.ceil(over)), MAX_RETRY_AFTER_S)
