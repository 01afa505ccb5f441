"""The GPU catalog as the autoscaler reads it: each GPU kind's hourly price.

The planner's catalog (`blockq plan --catalog`) describes each kind by its datasheet too; the
autoscaler needs only the name and the price, so it reads any JSON list of objects (or an object
whose `kinds` or `gpus` is that list) with `name` and a price under `price_per_hour` (or
`hourly_price`, `usd_per_hour`). Pure: parsing takes the text, the caller reads the file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

__all__ = ["CatalogError", "parse_prices", "missing_kinds"]

_PRICE_KEYS = ("price_per_hour", "hourly_price", "usd_per_hour")


class CatalogError(ValueError):
    """The catalog is malformed; the message names the kind or place."""


def parse_prices(text: str) -> dict[str, float]:
    """GPU kind -> price per hour, from a catalog's JSON text."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CatalogError(f"GPU catalog is not valid JSON: {exc}") from None
    if isinstance(raw, dict):
        raw = raw.get("kinds", raw.get("gpus"))
    if not isinstance(raw, list) or not raw:
        raise CatalogError("GPU catalog must be a non-empty list of kinds like "
                           '{"name": "a100-80gb", "price_per_hour": 3.67}')
    prices: dict[str, float] = {}
    for index, kind in enumerate(raw):
        name = kind.get("name") if isinstance(kind, dict) else None
        if not isinstance(name, str) or not name:
            raise CatalogError(f"GPU catalog kind {index}: no name")
        price = next((kind[key] for key in _PRICE_KEYS if key in kind), None)
        if isinstance(price, bool) or not isinstance(price, int | float) or price < 0:
            raise CatalogError(f"GPU catalog kind {name!r}: price_per_hour must be a number "
                               f">= 0, got {price!r}")
        if name in prices:
            raise CatalogError(f"GPU catalog kind {name!r} is listed twice")
        prices[name] = float(price)
    return prices


def missing_kinds(gpu_kinds: list[str | None], prices: Mapping[str, float]) -> list[str]:
    """'fleet entry <i>: gpu_kind <kind> is not in the GPU catalog (known: ...)' for each entry
    whose kind the catalog lacks."""
    return [f"fleet entry {index}: gpu_kind {kind!r} is not in the GPU catalog "
            f"(known: {sorted(prices)})"
            for index, kind in enumerate(gpu_kinds) if kind is not None and kind not in prices]
