"""The shared prefix cache: units found by chained hashes, LRU eviction, and both simulators
agreeing on snapshots whose requests share prefixes."""

from __future__ import annotations

import dataclasses
import random

import pytest

from workers.sim import (
    BlockPool,
    ExecModel,
    InstanceConfig,
    InstanceSnapshot,
    Scheduler,
    SeqState,
    SimRequest,
    predict_what_if,
    predict_what_if_stepwise,
    prepare,
)
from workers.sim.block_pool import chain_prefix_hashes
from workers.sim.snapshot import matched_prefix_tokens, prefix_keys

from .cases import random_case
from .test_whatif import assert_same


def keys(*hashes: int) -> tuple[int, ...]:
    return chain_prefix_hashes(hashes)


# -- the pool -------------------------------------------------------------------------------

def test_chained_keys_differ_when_an_earlier_block_differs() -> None:
    a, b = keys(1, 2, 3), keys(9, 2, 3)
    assert a[0] != b[0] and a[1] != b[1] and a[2] != b[2]
    assert keys(1, 2) == a[:2]  # a shared prefix has the same keys


def test_a_released_unit_is_found_until_evicted() -> None:
    pool = BlockPool(10, track_owners=True, unit_blocks=2)
    pool.allocate(4)  # a request computes two units in its own blocks
    k = keys(1, 2)
    assert pool.cache_unit(k[0]) and pool.cache_unit(k[1])
    assert pool.match_prefix(k, 5) == (2, 0)  # in use: a hit that costs nothing
    pool.release_prefix(k)
    assert pool.num_free == 10 and pool.match_prefix(k, 5) == (2, 4)
    assert pool.match_prefix(keys(1, 3), 5) == (1, 2)  # the chain stops at the first miss
    assert pool.match_prefix(k, 1) == (1, 2)  # capped
    pool.acquire_prefix(k)  # a hit takes its units out of the free queue
    assert pool.num_free == 6 and pool.match_prefix(k, 5) == (2, 0)
    assert pool.cached_keys() == frozenset(k)


def test_eviction_takes_the_oldest_free_units_and_a_prefix_tail_first() -> None:
    pool = BlockPool(8, track_owners=True, unit_blocks=2)
    first, second = keys(1, 2), keys(5, 6)
    for k in (first, second):
        pool.allocate(4)
        pool.cache_unit(k[0]), pool.cache_unit(k[1])
    pool.release_prefix(first)   # queue: first[1], first[0]
    pool.release_prefix(second)  # then second[1], second[0]
    assert pool.num_free == 8 and pool.num_in_use_blocks == 0
    pool.allocate(2)  # nothing anonymous is left: the oldest unit goes
    assert pool.match_prefix(first, 2) == (1, 2)  # its tail went first: a prefix survives
    assert not pool.is_cached(first[1]) and pool.match_prefix(second, 2) == (2, 4)
    pool.allocate(3)  # first[0], and second[1] partly: a partly evicted unit is lost whole
    assert not pool.is_cached(first[0]) and not pool.is_cached(second[1])
    assert pool.num_free == 3 and pool.match_prefix(second, 2) == (1, 2)
    pool.allocate(1)  # the partly evicted unit's last block
    assert pool.is_cached(second[0])


def test_a_held_unit_is_freed_by_its_last_holder_only() -> None:
    pool = BlockPool(4, track_owners=True, unit_blocks=1)
    k = keys(7)
    pool.allocate(1)
    pool.cache_unit(k[0])
    pool.acquire_prefix(k)  # a second request hits it
    pool.release_prefix(k)
    assert pool.num_free == 3 and pool.match_prefix(k, 1) == (1, 0)
    pool.release_prefix(k)
    assert pool.num_free == 4 and pool.match_prefix(k, 1) == (1, 1)
    assert not pool.cache_unit(k[0])  # already cached: a second copy is not registered


# -- the scheduler --------------------------------------------------------------------------

def cfg(**overrides) -> InstanceConfig:
    values = dict(num_total_blocks=65, block_size=4, max_num_seqs=4, max_num_batched_tokens=16,
                  max_model_len=128, enable_prefix_caching=True, prefix_block_size=8)
    return InstanceConfig(**(values | overrides))


def hashed(config: InstanceConfig, request_id: str, prompt: int, output: int,
           hashes: tuple[int, ...]) -> SeqState:
    spec = SimRequest(request_id, prompt, prefix_hashes=hashes)
    return SeqState(request_id, prompt, output, prefix_keys=prefix_keys(spec, config))


def run(scheduler: Scheduler) -> list:
    results = []
    while scheduler.has_unfinished_requests:
        results.append(scheduler.step())
    return results


def test_a_later_request_computes_only_what_the_cache_lacks() -> None:
    config = cfg()
    scheduler = Scheduler(config)
    scheduler.add_request(hashed(config, "a", 40, 2, (1, 2, 3, 4, 5)))
    run(scheduler)
    b = hashed(config, "b", 41, 2, (1, 2, 3, 9, 9, 9))
    scheduler.add_request(b)
    first = scheduler.schedule()
    # Units 1, 2, 3 (24 tokens) are cached; the fourth differs: 17 tokens to compute, the
    # first 16 now; b's two units computed this step join the cache.
    assert first.num_scheduled_tokens["b"] == 16 and first.stats.num_prefill_tokens == 16
    assert b.num_computed_tokens == 40 and b.num_prefix_held == 5


def test_the_hit_stops_one_token_short_of_the_prompt() -> None:
    config = cfg()
    scheduler = Scheduler(config)
    scheduler.add_request(hashed(config, "a", 16, 1, (1, 2)))
    run(scheduler)
    b = hashed(config, "b", 16, 1, (1, 2))
    scheduler.add_request(b)
    assert scheduler.schedule().num_scheduled_tokens["b"] == 8  # one unit, not two


def test_requests_running_together_share_units_and_free_them_last_holder_last() -> None:
    config = cfg()
    scheduler = Scheduler(config)
    scheduler.add_request(hashed(config, "a", 16, 20, (1, 2)))
    scheduler.step()  # a's whole prompt: both units join the cache, in use
    b = hashed(config, "b", 24, 3, (1, 2, 3))
    scheduler.add_request(b)
    scheduler.step()
    assert b.num_prefix_held == 3 and b.num_shared_blocks == 6
    assert scheduler.block_pool.num_in_use_blocks == 6  # 2 shared units + b's own third
    run(scheduler)
    pool = scheduler.block_pool
    assert pool.num_free == config.num_usable_blocks and pool.num_in_use_blocks == 0
    assert pool.cached_keys() == frozenset(keys(1, 2, 3))


def test_unique_hashes_change_nothing(toy_model: ExecModel) -> None:
    """No shared prefix: the same schedule as without hashes (and no hashes = today's)."""
    rng = random.Random(5)
    for index in range(30):
        snapshot, new = random_case(rng)
        config = dataclasses.replace(snapshot.config, enable_prefix_caching=True)
        snapshot, new = _with_hashes(dataclasses.replace(snapshot, config=config), new,
                                     lambda r: (), num_cached_tokens=0)
        plain = predict_what_if_stepwise(snapshot, new, toy_model)
        unique = _with_hashes(snapshot, new, lambda r, n=index: tuple(
            hash((n, r.request_id, i)) for i in range(64)))
        assert_same(predict_what_if_stepwise(*unique, toy_model), plain)
        assert_same(predict_what_if(*unique, toy_model), plain)


def _with_hashes(snapshot: InstanceSnapshot, new: SimRequest, hashes_of,  # type: ignore[no-untyped-def]
                 **changes):
    requests = tuple(dataclasses.replace(r, prefix_hashes=hashes_of(r), **changes)
                     for r in snapshot.requests)
    return (dataclasses.replace(snapshot, requests=requests),
            dataclasses.replace(new, prefix_hashes=hashes_of(new), **changes))


def shared_prefix_case(rng: random.Random) -> tuple[InstanceSnapshot, SimRequest]:
    """`random_case` with prefix caching on and prompts drawn from three shared prefixes."""
    snapshot, new = random_case(rng)
    config = snapshot.config
    unit = config.block_size * rng.choice([1, 2, 4])
    config = dataclasses.replace(config, enable_prefix_caching=True, prefix_block_size=unit)
    snapshot = dataclasses.replace(snapshot, config=config)

    def hashes_of(request: SimRequest) -> tuple[int, ...]:
        family = rng.randrange(3)
        split = rng.randrange(1, 64)
        return tuple(family * 1000 + i if i < split else rng.randrange(10**9)
                     for i in range(64))
    return _with_hashes(snapshot, new, hashes_of)


@pytest.mark.parametrize("seed", range(10))
def test_event_driven_equals_step_by_step_with_shared_prefixes(seed: int,
                                                               toy_model: ExecModel) -> None:
    rng = random.Random(1000 + seed)
    hits = 0
    for _ in range(40):
        snapshot, new = shared_prefix_case(rng)
        fast = predict_what_if(snapshot, new, toy_model)
        assert_same(fast, predict_what_if_stepwise(snapshot, new, toy_model))
        hits += fast.ttft_s < predict_what_if(
            *_with_hashes(snapshot, new, lambda r: ()), toy_model).ttft_s
    assert hits > 0  # shared prefixes do shorten some what-ifs


def test_matched_prefix_tokens_counts_leading_cached_units() -> None:
    config = cfg()
    request = SimRequest("x", 30, prefix_hashes=(1, 2, 3, 4))
    cached = frozenset(keys(1, 2, 8))
    assert matched_prefix_tokens(request, cached, config) == 16
    assert prefix_keys(request, config) == keys(1, 2, 3)  # 30 tokens: three full units
    assert matched_prefix_tokens(request, cached, cfg(enable_prefix_caching=False)) == 0
    assert prepare(InstanceSnapshot(config, 10, (request,))).waiting[0].prefix_keys == keys(
        1, 2, 3)
