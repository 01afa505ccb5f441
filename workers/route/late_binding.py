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

from dataclasses import dataclass

from workers.route.policies import InstanceView
from workers.sim import InstanceConfig

__all__ = ["LateBinding"]


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
