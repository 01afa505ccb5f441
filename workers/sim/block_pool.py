"""Free KV blocks, in the order vLLM's free queue would evict them, and the prefix cache."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Protocol

__all__ = ["BlockPool", "PrefixHolder", "chain_prefix_hashes"]

#: Segment kinds in the free queue (the first item of a segment's key).
_ANON, _OWNED, _PREFIX = 0, 1, 2


def chain_prefix_hashes(block_hashes: Iterable[int]) -> tuple[int, ...]:
    """Each prefix block's key: its hash chained with every block before it, as vLLM does.

    Two requests share block i's key only if they share blocks 0..i. Deterministic across
    processes (Python hashes tuples of ints without a per-process salt).
    """
    keys = []
    parent = 0
    for block_hash in block_hashes:
        parent = hash((parent, int(block_hash)))
        keys.append(parent)
    return tuple(keys)


class PrefixHolder(Protocol):
    """A request's prefix bookkeeping, as both simulators keep it."""

    prefix_keys: tuple[int, ...]
    num_prefix_held: int  # leading keys whose units it holds
    prefix_open: bool  # False once a unit was found cached by another: no more caching
    num_shared_blocks: int
    num_owned_blocks: int


class BlockPool:
    """A count of free KV blocks and, with prefix caching, whose cached blocks they are.

    vLLM keeps free blocks in one queue: allocation takes from the head, freed full
    blocks join the tail (partial ones the head), and a freed block keeps its cached
    contents until it is taken.

    Two kinds of cached contents are tracked, as segments of the queue:

    * a preempted request's own blocks (``[owner, count]``): readmitted, it reuses those
      still in the queue instead of recomputing them;
    * prefix units (`cache_unit`): ``unit_blocks`` blocks holding one prefix hash block of
      a prompt (a chained key, see `chain_prefix_hashes`), shared by every request whose
      prompt starts with the same blocks. A unit is *in use* (reference counted) while a
      running request holds it and joins the queue's tail when the last one lets it go;
      a request that finds it (`match_prefix`, `acquire_prefix`) takes it back out of the
      queue, as vLLM "touches" a cache hit.

    Blocks freed without an owner (a finished request's own blocks, the snapshot's free
    blocks) form anonymous segments nobody reuses.

    NOTE: vLLM frees a request's blocks tail first, so eviction from the head removes
    a preempted request's last blocks first and what survives is always a prefix. A unit
    the head eviction only partly takes is lost whole (its remaining blocks stay free,
    anonymous): with ``unit_blocks`` 1 this is vLLM's block-by-block eviction exactly.
    """

    __slots__ = ("num_free", "unit_blocks", "_queue", "_in_use", "_next_anon")

    def __init__(self, num_free: int, track_owners: bool = False, unit_blocks: int = 1) -> None:
        if num_free < 0:
            raise ValueError(f"num_free must not be negative, got {num_free}")
        if unit_blocks < 1:
            raise ValueError(f"unit_blocks must be positive, got {unit_blocks}")
        self.num_free = num_free
        #: KV blocks of one prefix unit (tokens per prefix hash / tokens per block).
        self.unit_blocks = unit_blocks
        #: The free queue, head first: segment key -> blocks; None without prefix caching.
        self._queue: OrderedDict[tuple[int, object], int] | None = None
        #: Prefix units running requests hold: chained key -> reference count.
        self._in_use: dict[int, int] = {}
        self._next_anon = 0
        if track_owners:
            self._queue = OrderedDict()
            if num_free:
                self._queue[self._anon_key()] = num_free

    def _anon_key(self) -> tuple[int, object]:
        self._next_anon += 1
        return (_ANON, self._next_anon)

    # -- plain blocks ---------------------------------------------------------------------
    def allocate(self, num_blocks: int) -> None:
        """Take `num_blocks` from the head of the queue, evicting what they cached."""
        assert 0 <= num_blocks <= self.num_free, (num_blocks, self.num_free)
        self.num_free -= num_blocks
        queue = self._queue
        if queue is None:
            return
        while num_blocks:
            key, count = next(iter(queue.items()))
            if count > num_blocks:
                if key[0] == _PREFIX:  # a unit partly evicted is lost whole
                    del queue[key]
                    key = self._anon_key()
                    queue[key] = count - num_blocks
                    queue.move_to_end(key, last=False)
                else:
                    queue[key] = count - num_blocks
                return
            num_blocks -= count
            queue.popitem(last=False)

    def free(self, num_blocks: int, owner: str | None = None, reusable: bool = True) -> None:
        """Return `num_blocks` to the queue.

        Reusable (full, cached) blocks join the tail, kept for `owner` if given;
        others (a partial last block) join the head and are taken first, as
        vLLM's ``BlockPool.free_blocks`` does.
        """
        assert num_blocks >= 0, num_blocks
        self.num_free += num_blocks
        queue = self._queue
        if queue is None or not num_blocks:
            return
        if not reusable:
            head = next(iter(queue), None)
            if head is not None and head[0] == _ANON:
                queue[head] += num_blocks
            else:
                key = self._anon_key()
                queue[key] = num_blocks
                queue.move_to_end(key, last=False)
            return
        if owner is None:
            tail = next(reversed(queue), None)
            key = tail if tail is not None and tail[0] == _ANON else self._anon_key()
        else:
            key = (_OWNED, owner)
        queue[key] = queue.get(key, 0) + num_blocks

    def release(self, num_blocks: int, num_full: int, owner: str | None = None) -> None:
        """Free a request's `num_blocks`, of which the first `num_full` are full."""
        self.free(num_blocks - num_full, reusable=False)
        self.free(num_full, owner)

    def num_cached(self, owner: str) -> int:
        """Blocks of `owner` still cached in the queue (0 without prefix caching)."""
        if self._queue is None:
            return 0
        return self._queue.get((_OWNED, owner), 0)

    def reclaim(self, owner: str, max_blocks: int) -> int:
        """Take up to `max_blocks` of `owner`'s cached blocks out of the queue.

        Returns how many were taken. Cached blocks beyond that stay in the queue but
        are no longer the owner's to reuse.
        """
        queue = self._queue
        key = (_OWNED, owner)
        if queue is None or key not in queue:
            return 0
        count = queue[key]
        taken = min(count, max_blocks)
        self.num_free -= taken
        if count > taken:
            # NOTE: the rest keeps its place in the queue, anonymous.
            items = list(queue.items())
            queue.clear()
            for item_key, item_count in items:
                if item_key == key:
                    queue[self._anon_key()] = count - taken
                else:
                    queue[item_key] = item_count
        else:
            del queue[key]
        return taken

    # -- prefix units ---------------------------------------------------------------------
    @property
    def num_in_use_blocks(self) -> int:
        """Blocks of the prefix units running requests hold."""
        return len(self._in_use) * self.unit_blocks

    def is_cached(self, key: int) -> bool:
        """Whether prefix unit `key` is cached, in use or free."""
        queue = self._queue
        return queue is not None and (key in self._in_use or (_PREFIX, key) in queue)

    def match_prefix(self, keys: Sequence[int], max_units: int) -> tuple[int, int]:
        """(leading units of `keys` cached, up to `max_units`; of those, blocks in the queue).

        Taking the ones in the queue costs free blocks (vLLM counts them too)."""
        queue = self._queue
        if queue is None:
            return 0, 0
        in_use = self._in_use
        num_units = queue_blocks = 0
        for key in keys[:max_units]:
            if key in in_use:
                num_units += 1
            elif (_PREFIX, key) in queue:
                num_units += 1
                queue_blocks += self.unit_blocks
            else:
                break
        return num_units, queue_blocks

    def acquire_prefix(self, keys: Sequence[int]) -> None:
        """Hold the cached units `keys` (a match): one more reference each, out of the queue."""
        queue = self._queue
        assert queue is not None
        in_use = self._in_use
        for key in keys:
            if key in in_use:
                in_use[key] += 1
            else:
                del queue[(_PREFIX, key)]
                self.num_free -= self.unit_blocks
                in_use[key] = 1

    def cache_unit(self, key: int) -> bool:
        """Register a unit a running request has just computed in its own blocks.

        False (the request keeps the blocks as its own) if the unit is cached already:
        another request computed the same blocks meanwhile.
        """
        if self._queue is None or self.is_cached(key):
            return False
        self._in_use[key] = 1
        return True

    def cache_computed_units(self, seq: PrefixHolder, num_computed: int,
                             unit_tokens: int) -> None:
        """Add the prefix units `seq` has computed (`num_computed` tokens) to the cache (its
        blocks become shared); stop at one the cache has already (vLLM keeps the first)."""
        keys = seq.prefix_keys
        held = seq.num_prefix_held
        while held < len(keys) and (held + 1) * unit_tokens <= num_computed:
            if not self.cache_unit(keys[held]):
                seq.prefix_open = False
                break
            held += 1
            seq.num_shared_blocks += self.unit_blocks
            seq.num_owned_blocks -= self.unit_blocks
        seq.num_prefix_held = held

    def release_prefix(self, keys: Sequence[int]) -> None:
        """Let go of held units (a prefix of a request's keys): last first, as vLLM frees a
        request's blocks, so the queue evicts a prefix's tail before its head."""
        queue = self._queue
        assert queue is not None
        in_use = self._in_use
        for key in reversed(keys):
            count = in_use[key] - 1
            if count:
                in_use[key] = count
                continue
            del in_use[key]
            queue[(_PREFIX, key)] = self.unit_blocks
            self.num_free += self.unit_blocks

    def cached_keys(self) -> frozenset[int]:
        """Every cached prefix unit, in use or free: what an instance publishes."""
        queue = self._queue
        if queue is None:
            return frozenset()
        free = (key[1] for key in queue if key[0] == _PREFIX)
        return frozenset((*self._in_use, *free))  # type: ignore[arg-type]
