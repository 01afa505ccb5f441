"""The free-block queue: counts, and which preempted request's cached blocks survive."""

from __future__ import annotations

from workers.sim import BlockPool


def test_counting_only_without_prefix_caching() -> None:
    pool = BlockPool(10)
    pool.allocate(4)
    pool.free(2, owner="a")
    assert pool.num_free == 8 and pool.num_cached("a") == 0 and pool.reclaim("a", 5) == 0


def test_allocation_evicts_oldest_free_blocks_first() -> None:
    pool = BlockPool(3, track_owners=True)
    pool.free(4, owner="a")  # a's blocks join the tail, behind 3 anonymous ones
    pool.free(2, owner="b")
    pool.allocate(5)         # 3 anonymous + 2 of a's (its last ones)
    assert (pool.num_free, pool.num_cached("a"), pool.num_cached("b")) == (4, 2, 2)
    pool.allocate(3)
    assert (pool.num_cached("a"), pool.num_cached("b")) == (0, 1)


def test_reclaim_takes_a_prefix_and_forgets_the_rest() -> None:
    pool = BlockPool(0, track_owners=True)
    pool.free(5, owner="a")
    assert pool.reclaim("a", 3) == 3
    assert pool.num_free == 2 and pool.num_cached("a") == 0
    pool.allocate(2)
    assert pool.num_free == 0
