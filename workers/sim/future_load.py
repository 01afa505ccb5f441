"""Expected future load: the requests an instance will get after the one a what-if places.

A what-if starts from a snapshot, so on its own it cannot see the requests that arrive while
the new request runs; those join the batch, their prefill chunks slow every step they share
with it, and the what-if runs short under load. `FutureLoad` describes the expected arrivals
(a rate and a mean request shape, estimated by the caller from recent history, e.g. with
`estimate_future_load`); the what-if injects them deterministically, evenly spaced at the
rate (the k-th at ``(k + phase) / rate`` seconds from the snapshot), each with the mean
shape, queued behind everything else.

Pure: no I/O, no clock (times are the caller's).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from .snapshot import InstanceConfig, SeqSpec, SimRequest, normalise

__all__ = ["FUTURE_ID_PREFIX", "NO_FUTURE_LOAD", "FutureLoad", "estimate_future_load"]

#: Ids of the synthetic requests (``~future-0``, ``~future-1``, ...).
FUTURE_ID_PREFIX = "~future-"


@dataclass(frozen=True, slots=True)
class FutureLoad:
    """Requests expected to arrive at an instance after the snapshot moment."""

    #: Expected arrivals per second (0: none; the what-if is then unchanged).
    rate_per_s: float = 0.0
    #: Mean prompt length of an arrival, in tokens.
    num_prompt_tokens: float = 0.0
    #: Mean (predicted) output length of an arrival, in tokens.
    num_output_tokens: float = 0.0
    #: Offset of the first arrival, in inter-arrival gaps: 0.5 makes the count of injected
    #: arrivals by any time t round ``rate * t``, the expected count of a Poisson stream.
    phase: float = 0.5

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate_per_s) and self.rate_per_s >= 0.0):
            raise ValueError(f"rate_per_s must be finite and >= 0, got {self.rate_per_s}")
        if self.rate_per_s > 0.0 and (self.num_prompt_tokens <= 0 or self.num_output_tokens <= 0):
            raise ValueError("a positive rate needs positive mean prompt and output lengths")
        if not 0.0 <= self.phase <= 1.0:
            raise ValueError(f"phase must be in [0, 1], got {self.phase}")

    @property
    def active(self) -> bool:
        return self.rate_per_s > 0.0

    def arrival_s(self, index: int) -> float:
        """Seconds from the snapshot to the `index`-th arrival (from 0)."""
        return (index + self.phase) / self.rate_per_s

    def spec(self, config: InstanceConfig) -> SeqSpec:
        """The mean request, normalised for `config` (id of the first arrival)."""
        prompt = min(max(1, round(self.num_prompt_tokens)), config.max_model_len - 1)
        output = max(1, round(self.num_output_tokens))
        return normalise(SimRequest(f"{FUTURE_ID_PREFIX}0", prompt,
                                    predicted_output_tokens=output), config)


NO_FUTURE_LOAD = FutureLoad()


def estimate_future_load(arrivals: Iterable[tuple[float, int, int | None]], now: float,
                         window_s: float, since: float | None = None) -> FutureLoad:
    """The arrival rate and mean shape of `arrivals` in the last `window_s` before `now`.

    `arrivals`: ``(time, prompt tokens, output tokens)`` of past arrivals at one instance
    (output: predicted or known; None counts as missing and is left out of its mean). Only
    those in ``[now - window_s, now)`` count. `since`: when observation began (a router
    that started 2 s ago saw 2 s of history), else the window is taken as fully observed.
    """
    if window_s <= 0:
        return NO_FUTURE_LOAD
    start = now - window_s
    span = window_s if since is None else min(window_s, now - since)
    if span <= 0:
        return NO_FUTURE_LOAD
    count = prompt_sum = output_sum = outputs = 0
    for at, prompt, output in arrivals:
        if start <= at < now:
            count += 1
            prompt_sum += prompt
            if output:
                output_sum += output
                outputs += 1
    if not count or not outputs:
        return NO_FUTURE_LOAD
    return FutureLoad(count / span, prompt_sum / count, output_sum / outputs)
