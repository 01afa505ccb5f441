"""The answer to a what-if question: the new request's predicted timeline on one instance."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WhatIf"]


@dataclass(frozen=True, slots=True)
class WhatIf:
    """Seconds from the snapshot's moment, had the instance got the new request then."""

    #: Until its first output token.
    ttft_s: float
    #: Until its last output token.
    e2e_s: float
    #: Until it is first scheduled.
    queueing_s: float
    #: First-order delay it causes the instance's other requests, summed over them:
    #: for every step it runs in, the extra step time it adds times the number of
    #: other unfinished requests (each of them finishes that much later). Only the
    #: snapshot's requests count, not expected future arrivals.
    delay_to_others_s: float
    #: Engine steps simulated.
    num_steps: int
    #: Preemptions in the simulated span (any request).
    num_preemptions: int
