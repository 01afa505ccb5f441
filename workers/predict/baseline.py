"""The honest baseline length predictor: the running mean of observed output lengths.

It knows nothing about the prompt. It stands in until the learned model (a later stage) exists,
and every prediction it makes is labelled with its name so histories show what made it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RunningMeanPredictor", "LengthStats"]


@dataclass(frozen=True, slots=True)
class LengthStats:
    """Output lengths observed so far on one served model."""

    total_tokens: int
    count: int


@dataclass(frozen=True, slots=True)
class RunningMeanPredictor:
    # Used until the first request finishes.
    prior_tokens: int = 128
    name: str = "baseline.running_mean"

    def predict(self, stats: LengthStats, *, max_tokens: int) -> int:
        mean = stats.total_tokens / stats.count if stats.count else self.prior_tokens
        return max(1, min(max_tokens, round(mean)))
