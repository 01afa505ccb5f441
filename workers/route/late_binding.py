"""Late binding: the router holds a request while no instance would start it soon.

A request bound to an instance waits there even when another instance frees first (a length
under-predicted, a step slower than priced). Held at the router, in arrival order, it goes to
whichever instance has room first: one fleet-wide queue instead of one per instance, which
cuts the tail of the wait (the classic M/G/c against c x M/G/1 gap).

Pure (part of the core): the cluster simulation and the route stage ask `would_start` of each
candidate's view, hold the request while no candidate would, and release held requests in
arrival order as instances publish.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from workers.route.policies import InstanceView
from workers.sim import InstanceConfig

__all__ = ["Held", "LateBinding", "must_wait", "release"]

H = TypeVar("H", bound="Held")


@dataclass(frozen=True, slots=True)
class LateBinding:
    """When a request is held. An instance would start it when:

    - its view carries a what-if (a policy that simulates): the simulated wait until the
      instance first schedules it is at most `max_queueing_s`;
    - otherwise: it has a seat and the KV blocks for the prompt after what its waiting and
      routed requests need, keeping `kv_reserve` of its blocks for the running requests to
      grow into (what a load balancer can tell from the published counts).
    """

    max_queueing_s: float = 0.1
    kv_reserve: float = 0.05
    #: Later requests may pass a held one (each to an instance that would start it) until
    #: it has been held this long (s); 0: strict arrival order. A long prompt waiting for KV
    #: blocks then does not hold up the short ones behind it, and still cannot starve.
    overtake_s: float = 0.0
    #: How many held requests, oldest first, may go to an instance that has just published.
    overtake_scan: int = 16

    def __post_init__(self) -> None:
        if self.max_queueing_s < 0 or self.overtake_s < 0 or not 0 <= self.kv_reserve < 1:
            raise ValueError("max_queueing_s and overtake_s must not be negative, kv_reserve "
                             "in [0, 1)")
        if self.overtake_scan < 1:
            raise ValueError("overtake_scan must be positive")

    def would_start(self, view: InstanceView, num_prompt_tokens: int,
                    config: InstanceConfig) -> bool:
        if view.what_if_queueing_s is not None:
            return view.what_if_queueing_s <= self.max_queueing_s
        return self.has_room(view, num_prompt_tokens, config)

    def has_room(self, view: InstanceView, num_prompt_tokens: int,
                 config: InstanceConfig) -> bool:
        """A seat, and the prompt's blocks beyond the waiting ones' and the reserve."""
        seats = config.max_num_seqs - view.num_running - view.num_waiting - view.num_assigned
        prompt_blocks = -(-num_prompt_tokens // config.block_size)
        spare = (view.num_free_blocks - view.num_waiting_prompt_blocks
                 - self.kv_reserve * view.num_total_blocks)
        return seats >= 1 and spare >= prompt_blocks


@dataclass(frozen=True, slots=True)
class Held:
    """A request held at the router: since when, and the model it asked for (None: a request
    of no recorded model, which may run anywhere)."""

    request_id: str
    since: float
    model: str | None = None


def must_wait(model: str | None, held: Iterable[Held], now: float, overtake_s: float) -> bool:
    """Whether a new request of `model` waits behind the held ones: one of its model has been
    held `overtake_s` or longer (strict arrival order within a model from then on; a request
    of no recorded model waits behind every model's, and every model's behind it)."""
    cutoff = now - overtake_s
    return any(h.since <= cutoff and (model is None or h.model in (model, None)) for h in held)


def release(held: Sequence[H], now: float, overtake_s: float,
            try_route: Callable[[H], bool]) -> list[H]:
    """Try to route the held requests, oldest first; those routed, in order.

    A request not routed that has been held `overtake_s` or longer stops the later ones of
    its model (another model's run on other instances: they never wait behind it); before
    that, later requests may pass it, each to an instance that would start it.
    """
    blocked: set[str | None] = set()
    released = []
    for entry in held:
        if entry.model in blocked or None in blocked:
            continue
        if try_route(entry):
            released.append(entry)
        elif now - entry.since >= overtake_s:
            blocked.add(entry.model)
    return released
