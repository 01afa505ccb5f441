"""Free KV blocks, in the order vLLM's free queue would evict them."""

from __future__ import annotations

from collections import deque

__all__ = ["BlockPool"]


class BlockPool:
    """A count of free KV blocks and, with prefix caching, whose cached blocks they are.

    vLLM keeps free blocks in one queue: allocation takes from the head, freed full
    blocks join the tail (partial ones the head), and a freed block keeps its cached
    contents until it is taken.
    With prefix caching on, a preempted request that is readmitted reuses those of its
    blocks still in the queue instead of recomputing them. The pool tracks that as
    segments ``[owner, count]``; blocks freed without an owner (a finished request,
    the snapshot's free blocks) form anonymous segments nobody reuses.

    NOTE: vLLM frees a request's blocks tail first, so eviction from the head removes
    a preempted request's last blocks first and what survives is always a prefix.
    """

    __slots__ = ("num_free", "_segments")

    def __init__(self, num_free: int, track_owners: bool = False) -> None:
        if num_free < 0:
            raise ValueError(f"num_free must not be negative, got {num_free}")
        self.num_free = num_free
        self._segments: deque[list] | None = None
        if track_owners:
            self._segments = deque([[None, num_free]] if num_free else [])

    def allocate(self, num_blocks: int) -> None:
        """Take `num_blocks` from the head of the queue, evicting what they cached."""
        assert 0 <= num_blocks <= self.num_free, (num_blocks, self.num_free)
        self.num_free -= num_blocks
        segments = self._segments
        if segments is None:
            return
        while num_blocks:
            head = segments[0]
            if head[1] > num_blocks:
                head[1] -= num_blocks
                return
            num_blocks -= head[1]
            segments.popleft()

    def free(self, num_blocks: int, owner: str | None = None, reusable: bool = True) -> None:
        """Return `num_blocks` to the queue.

        Reusable (full, cached) blocks join the tail, kept for `owner` if given;
        others (a partial last block) join the head and are taken first, as
        vLLM's ``BlockPool.free_blocks`` does.
        """
        assert num_blocks >= 0, num_blocks
        self.num_free += num_blocks
        segments = self._segments
        if segments is None or not num_blocks:
            return
        if not reusable:
            if segments and segments[0][0] is None:
                segments[0][1] += num_blocks
            else:
                segments.appendleft([None, num_blocks])
        elif owner is None and segments and segments[-1][0] is None:
            segments[-1][1] += num_blocks
        else:
            segments.append([owner, num_blocks])

    def release(self, num_blocks: int, num_full: int, owner: str | None = None) -> None:
        """Free a request's `num_blocks`, of which the first `num_full` are full."""
        self.free(num_blocks - num_full, reusable=False)
        self.free(num_full, owner)

    def num_cached(self, owner: str) -> int:
        """Blocks of `owner` still cached in the queue (0 without prefix caching)."""
        for segment in self._segments or ():
            if segment[0] == owner:
                return segment[1]
        return 0

    def reclaim(self, owner: str, max_blocks: int) -> int:
        """Take up to `max_blocks` of `owner`'s cached blocks out of the queue.

        Returns how many were taken. Cached blocks beyond that stay in the queue but
        are no longer the owner's to reuse.
        """
        for index, segment in enumerate(self._segments or ()):
            if segment[0] == owner:
                taken = min(segment[1], max_blocks)
                self.num_free -= taken
                segment[0] = None
                segment[1] -= taken
                if not segment[1]:
                    del self._segments[index]
                return taken
        return 0
