"""Percentiles as every benchmark computes them."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["percentile", "percentile_certainly_above", "quantile"]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with numpy's default (linear) interpolation; a value of inf
    (a request that never got its first token) ranks last, and a percentile that reaches one is
    inf. nan for no values."""
    if not len(values):
        return math.nan
    ordered = sorted(float(v) for v in values)
    position = q / 100 * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    if math.isinf(ordered[high]):
        return math.inf
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def quantile(values: Sequence[float], q: float) -> float:
    """The q-th quantile (0-1): `percentile` at 100 q."""
    return percentile(values, 100 * q)


def percentile_certainly_above(num_above: int, total: int, q: float) -> bool:
    """Whether `num_above` of `total` values above a bound make the q-th percentile (as
    `percentile` computes it) exceed that bound, whatever the other values turn out to be.

    The percentile interpolates between the sorted values at floor and ceil of q/100 x (n-1);
    once the lower of the two is above the bound, so is the percentile.
    """
    if total <= 0:
        return False
    return num_above >= total - math.floor(q / 100 * (total - 1))
