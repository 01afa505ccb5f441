"""How many batch requests may be in flight now: additive increase while interactive traffic
meets its latency target, multiplicative decrease when it misses or its queue grows. Pure: no
I/O (the releaser measures the signal and keeps the window between its rounds).

Batch work should use the capacity interactive traffic leaves free, and only that. A fixed cap
(`max_batch_in_flight`) is either too small for an idle fleet or too large for a busy one; the
window finds the level at which interactive requests stop noticing, as TCP's congestion window
finds a path's capacity: each round without a sign of harm adds `increase` slots, each sign of
harm multiplies the window by `decrease`. Signs of harm:

- the interactive TTFT p99 over the last window is above the target;
- interactive requests waiting for an engine (accepted, not running yet) grew since the last
  round and are more than `queue_slack` (a growing queue is a miss on its way).

That signal lags: a TTFT is known only when its request completes, seconds after the batch
lines that delayed it took their engine slots, and a running batch line keeps its slot for its
whole answer (vLLM preempts for KV blocks, never for a slot). So the window is also bounded feed
forward (`slot_bound`): the fleet's engine slots less those interactive traffic is expected to
occupy (Little's law over its recent history, plus a Poisson margin). Inside each engine
interactive requests already run before batch ones (workers/serve: class-first priorities).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["HeadroomConfig", "HeadroomSignal", "interactive_reserve", "next_window",
           "slot_bound"]


@dataclass(frozen=True, slots=True)
class HeadroomConfig:
    target_ttft_s: float  # interactive TTFT p99 the batch must not push past
    min_window: int  # batch requests always allowed (progress even under load)
    max_window: int  # never more than this (max_batch_in_flight)
    increase: float = 4.0  # slots added per round without harm
    decrease: float = 0.5  # factor per round with harm
    queue_slack: int = 2  # waiting interactive requests tolerated before growth counts


@dataclass(frozen=True, slots=True)
class HeadroomSignal:
    """What the releaser measured of interactive traffic this round."""

    ttft_p99_s: float | None  # over the recent window; None: no interactive request finished
    num_waiting: int  # interactive requests accepted and not yet running
    previous_num_waiting: int  # the same, last round


def harmed(signal: HeadroomSignal, config: HeadroomConfig) -> bool:
    """Whether interactive traffic shows harm this round."""
    missed = signal.ttft_p99_s is not None and signal.ttft_p99_s > config.target_ttft_s
    growing = (signal.num_waiting > config.queue_slack
               and signal.num_waiting > signal.previous_num_waiting)
    return missed or growing


def next_window(window: float, signal: HeadroomSignal, config: HeadroomConfig) -> float:
    """The window for the next round, within [min_window, max_window]."""
    if harmed(signal, config):
        window *= config.decrease
    else:
        window += config.increase
    return min(max(window, float(config.min_window)), float(config.max_window))


def interactive_reserve(occupancy: float, margin_sigmas: float) -> int:
    """Engine slots to keep for interactive requests: `occupancy` (how many run at once on
    average: their arrival rate x time in an engine, Little's law) plus `margin_sigmas`
    standard deviations of a Poisson count with that mean, so that bursts find a slot too."""
    if occupancy <= 0.0:
        return 0
    return math.ceil(occupancy + margin_sigmas * math.sqrt(occupancy))


def slot_bound(num_slots: int, occupancy: float, margin_sigmas: float) -> int:
    """Batch requests the fleet's `num_slots` engine slots (max_num_seqs summed) hold beside
    interactive traffic of `occupancy` without making an interactive request wait for one."""
    return max(0, num_slots - interactive_reserve(occupancy, margin_sigmas))
