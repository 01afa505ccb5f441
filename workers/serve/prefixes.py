"""What an engine publishes of its prefix cache: the chained keys of the prompt units it holds.

Engines with prefix caching hash each prompt in units of `live_prefix_unit_tokens` tokens with
`workers.sim.snapshot.prefix_unit_hashes` (the function routers hash new requests with) and
publish the chained keys of their in-flight requests' units and of the recently finished ones'
(`PrefixMemory.published`), capped: routers credit a new request's leading units found there.

NOTE: vLLM does not tell which blocks it still caches; the finished requests' units are kept
for as many units as its KV cache holds, newest first, which is what survives its LRU eviction
when nothing else competes. The emulated engine knows its cache exactly and filters by it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from workers.sim.block_pool import chain_prefix_hashes
from workers.sim.snapshot import prefix_unit_hashes

__all__ = ["MAX_PUBLISHED_PREFIX_KEYS", "PrefixMemory"]

#: Most keys one published state carries (12 characters each in its JSON).
MAX_PUBLISHED_PREFIX_KEYS = 2048


class PrefixMemory:
    """The units an engine's finished requests left in its cache, and what it publishes.

    Not thread-safe: the engine calls it under its own lock.
    """

    def __init__(self, unit_tokens: int, capacity_units: int,
                 max_published: int = MAX_PUBLISHED_PREFIX_KEYS) -> None:
        if unit_tokens <= 0:
            raise ValueError(f"unit_tokens must be positive, got {unit_tokens}")
        self.unit_tokens = unit_tokens
        self.max_published = max_published
        # Finished requests' keys, oldest first, at most as many as the cache holds units.
        self._capacity = max(0, min(capacity_units, max_published))
        self._finished: OrderedDict[int, None] = OrderedDict()

    def keys_of(self, token_ids: Sequence[int]) -> tuple[int, ...]:
        """The chained keys of a prompt's full units."""
        return chain_prefix_hashes(prefix_unit_hashes(token_ids, self.unit_tokens))

    def finished(self, keys: Sequence[int]) -> None:
        """A request with these keys left the engine: its units stay cached for a while."""
        finished = self._finished
        for key in keys:
            finished[key] = None
            finished.move_to_end(key)
        while len(finished) > self._capacity:
            finished.popitem(last=False)

    def published(self, in_flight: Iterable[Sequence[int]],
                  is_cached: Callable[[int], bool] | None = None) -> tuple[int, ...]:
        """The keys to publish: the in-flight requests' (they will be cached before a request
        routed now runs), then the finished ones', newest first (those `is_cached` accepts),
        at most `max_published`."""
        out: dict[int, None] = {}
        limit = self.max_published
        for keys in in_flight:
            for key in keys:
                out[key] = None
            if len(out) >= limit:
                return tuple(out)[:limit]
        for key in reversed(self._finished):
            if len(out) >= limit:
                break
            if key not in out and (is_cached is None or is_cached(key)):
                out[key] = None
        return tuple(out)
