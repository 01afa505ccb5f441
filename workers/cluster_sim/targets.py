"""Per-request latency targets for the cluster simulation, and whether a request met its.

A mix stands for traffic whose users ask different things: a chat user wants the first token
soon (a TTFT target), an agent step or a tool call wants the whole answer by a deadline that
grows with its length (an end-to-end target), a background job asks nothing. Goodput counts
the requests that met their targets (a request without one meets it by finishing).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LatencyTarget", "TargetMix", "draw_targets", "met"]


@dataclass(frozen=True, slots=True)
class LatencyTarget:
    ttft_s: float | None = None
    e2e_s: float | None = None


@dataclass(frozen=True, slots=True)
class TargetMix:
    """Shares of requests with a TTFT target, an end-to-end target, or none (the rest)."""

    ttft_share: float = 0.4
    ttft_s: float = 1.0
    e2e_share: float = 0.3
    #: An end-to-end target of e2e_slack_s + e2e_per_token_s x the request's output tokens
    #: (the client knows roughly how much it asked for: max_tokens, its task).
    e2e_per_token_s: float = 0.06
    e2e_slack_s: float = 2.0

    def __post_init__(self) -> None:
        if not (0 <= self.ttft_share and 0 <= self.e2e_share
                and self.ttft_share + self.e2e_share <= 1):
            raise ValueError("target shares must be >= 0 and sum to at most 1")


def draw_targets(num_output_tokens: Sequence[int], mix: TargetMix,
                 seed: int) -> list[LatencyTarget | None]:
    """One target (or None) per request, seeded: the same requests get the same targets in
    every run of a comparison."""
    rng = random.Random(seed)
    targets: list[LatencyTarget | None] = []
    for tokens in num_output_tokens:
        u = rng.random()
        if u < mix.ttft_share:
            targets.append(LatencyTarget(ttft_s=mix.ttft_s))
        elif u < mix.ttft_share + mix.e2e_share:
            targets.append(LatencyTarget(e2e_s=mix.e2e_slack_s + mix.e2e_per_token_s * tokens))
        else:
            targets.append(None)
    return targets


def met(target: LatencyTarget | None, ttft_s: float | None, e2e_s: float | None) -> bool:
    """Whether a request that ran with these latencies (None: it did not run) met `target`."""
    if ttft_s is None or e2e_s is None:
        return False
    if target is None:
        return True
    return ((target.ttft_s is None or ttft_s <= target.ttft_s)
            and (target.e2e_s is None or e2e_s <= target.e2e_s))
