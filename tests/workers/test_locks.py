"""The Redis locks of workers.locks on the real Redis: a renewed lock outlives its TTL while its
holder works, and a holder that dies (stops renewing) frees it within one TTL."""

from __future__ import annotations

import time

import redis

from workers import locks


def test_a_renewed_lock_is_held_past_its_ttl_and_released_after(empty_redis: redis.Redis
                                                                 ) -> None:
    # NOTE: renewed every 1 s (a third of the TTL): 2 s of slack for a loaded machine.
    with locks.held(empty_redis, "blockq:test:lock", ttl_s=3.0, renew=True) as mine:
        assert mine
        deadline = time.monotonic() + 7.0  # more than twice the TTL
        while time.monotonic() < deadline:
            with locks.held(empty_redis, "blockq:test:lock", ttl_s=3.0) as other:
                assert not other
            time.sleep(0.2)
    with locks.held(empty_redis, "blockq:test:lock", ttl_s=3.0) as after:
        assert after


def test_a_lock_whose_holder_stopped_renewing_expires_within_its_ttl(
        empty_redis: redis.Redis) -> None:
    lock = empty_redis.lock("blockq:test:dead", timeout=0.5)
    assert lock.acquire(blocking=False)  # a holder that is SIGKILLed now: nobody renews
    with locks.held(empty_redis, "blockq:test:dead", ttl_s=0.5) as at_once:
        assert not at_once
    deadline = time.monotonic() + 2.0
    while True:
        with locks.held(empty_redis, "blockq:test:dead", ttl_s=0.5) as taken:
            if taken:
                break
        assert time.monotonic() < deadline, "the lock outlived its TTL"
        time.sleep(0.05)
