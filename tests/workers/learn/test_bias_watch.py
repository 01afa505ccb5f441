"""The bias watch on the real Redis: misses enter the round-robin fallback for a bounded time,
and the correction factor follows actual/predicted."""

from __future__ import annotations

import time

import pytest
import redis

from domain.length_bias import BiasRule, BiasWatch, fallback_state

pytestmark = pytest.mark.services

MODEL = "tiny-llama"


@pytest.fixture
def client(empty_redis: redis.Redis) -> redis.Redis:
    return empty_redis


def test_five_consecutive_misses_enter_fallback_which_ends_by_itself(client: redis.Redis) -> None:
    watch = BiasWatch(client, BiasRule(window=5, threshold=0.3, fallback_s=0.5))
    assert [watch.observe(MODEL, 100, 200) for _ in range(4)] == [False] * 4
    assert watch.fallback() is None

    assert watch.observe(MODEL, 100, 200) is True  # the fifth miss in a row
    state = fallback_state(client)
    assert state is not None and state["model"] == MODEL and state["errors"] == [0.5] * 5
    assert state["until"] - state["since"] == pytest.approx(0.5)
    assert watch.observe(MODEL, 100, 200) is False  # already in fallback: not entered again

    time.sleep(0.6)
    assert watch.fallback() is None


def test_a_good_prediction_breaks_the_run_of_misses(client: redis.Redis) -> None:
    watch = BiasWatch(client, BiasRule(window=5, threshold=0.3))
    for _ in range(4):
        watch.observe(MODEL, 100, 200)
    watch.observe(MODEL, 190, 200)  # 5 % off
    assert [watch.observe(MODEL, 100, 200) for _ in range(4)] == [False] * 4
    assert watch.fallback() is None


def test_correction_moves_towards_actual_over_predicted_and_resets(client: redis.Redis) -> None:
    watch = BiasWatch(client, BiasRule(window=50, correction_rate=0.1, max_correction=4.0))
    assert watch.correction(MODEL) == 1.0
    for _ in range(10):
        watch.observe(MODEL, 100, 200)  # predictions are half the truth
    assert watch.correction(MODEL) == pytest.approx(2.0)  # exp(10 * 0.1 * ln 2)
    for _ in range(200):
        watch.observe(MODEL, 100, 10_000)
    assert watch.correction(MODEL) == pytest.approx(4.0)  # bounded
    watch.reset(MODEL)
    assert watch.correction(MODEL) == 1.0
