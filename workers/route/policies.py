"""Routing policies: one decision each, registered by name. Pure: no I/O, no clock.

A policy scores every candidate (lower is better) and the lowest wins, ties broken at random, so
every decision can be recorded with all candidates' scores.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from workers.registry import Registry

__all__ = ["RequestView", "InstanceView", "RoutingContext", "Decision", "Policy", "POLICIES", "decide"]


@dataclass(frozen=True, slots=True)
class RequestView:
    request_id: str
    num_prompt_tokens: int
    predicted_output_tokens: int | None
    max_tokens: int


@dataclass(frozen=True, slots=True)
class InstanceView:
    instance_id: str
    num_running: int
    num_waiting: int
    # Routed here but not yet admitted by the engine (absent from the published state).
    num_assigned: int
    num_free_blocks: int
    num_total_blocks: int


@dataclass(frozen=True, slots=True)
class RoutingContext:
    # A fleet-wide counter value drawn for this decision (round robin across router processes).
    ticket: int
    rng: random.Random


@dataclass(frozen=True, slots=True)
class Decision:
    policy: str
    instance_id: str
    scores: dict[str, float]


class Policy(Protocol):
    def scores(
        self, request: RequestView, fleet: Sequence[InstanceView], ctx: RoutingContext
    ) -> list[float]:
        """One score per instance of `fleet`, in order; the lowest wins."""
        ...


POLICIES: Registry[Policy] = Registry("routing policy")


@POLICIES.register("round_robin")
class RoundRobin:
    def scores(self, request, fleet, ctx):  # type: ignore[no-untyped-def]
        chosen = ctx.ticket % len(fleet)
        return [0.0 if i == chosen else 1.0 for i in range(len(fleet))]


@POLICIES.register("least_requests")
class LeastRequests:
    def scores(self, request, fleet, ctx):  # type: ignore[no-untyped-def]
        return [float(i.num_running + i.num_waiting + i.num_assigned) for i in fleet]


def decide(
    policy_name: str, request: RequestView, fleet: Sequence[InstanceView], ctx: RoutingContext
) -> Decision:
    """Apply the named policy to a non-empty fleet (sorted by id for stable round robin)."""
    if not fleet:
        raise ValueError("no candidate instances")
    ordered = sorted(fleet, key=lambda i: i.instance_id)
    scores = POLICIES.create(policy_name).scores(request, ordered, ctx)
    best = min(scores)
    winners = [inst.instance_id for inst, score in zip(ordered, scores, strict=True) if score == best]
    return Decision(
        policy=policy_name,
        instance_id=ctx.rng.choice(winners),
        scores={inst.instance_id: s for inst, s in zip(ordered, scores, strict=True)},
    )
