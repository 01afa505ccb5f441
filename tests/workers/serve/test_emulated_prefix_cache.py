"""The emulated engine's prefix cache: a repeated prefix is served from it (less prefill, a
sooner first token), and the state it publishes carries the units it holds, hashed as routers
hash a new request's prompt."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.workers.serve.recording import RecordingListener
from workers.serve.emulated_engine import EmulatedEngine
from workers.serve.engine import GenerationRequest
from workers.serve.prefixes import PrefixMemory
from workers.sim.block_pool import chain_prefix_hashes
from workers.sim.engine_state import EngineState
from workers.sim.snapshot import live_prefix_unit_tokens, prefix_unit_hashes

RESULT_TIMEOUT_S = 30
UNIT = live_prefix_unit_tokens(16)  # 64 tokens


@pytest.fixture
def make_engine(
        make_emulated_engine: Callable[..., EmulatedEngine]) -> Callable[..., EmulatedEngine]:
    def make(**overrides: object) -> EmulatedEngine:
        return make_emulated_engine(**{"enable_prefix_caching": True, **overrides})

    return make


def _ids(start: int, count: int) -> tuple[int, ...]:
    return tuple(range(start, start + count))


def _run(engine: EmulatedEngine, recorder: RecordingListener, request_id: str,
         token_ids: tuple[int, ...]) -> tuple[int, float]:
    """(prefill tokens the engine computed for the request alone, the emulated time of its
    prefill steps in ms: its time to first token as the engine models it, free of the
    machine's scheduling noise, which at these millisecond steps is as large)."""
    before = len(recorder.steps)
    result = engine.submit(GenerationRequest(request_id, "", max_tokens=4,
                                             prompt_token_ids=token_ids)).result(RESULT_TIMEOUT_S)
    with recorder.lock:
        steps = [s for s in recorder.steps[before:] if s.num_prefill_tokens]
    assert result.first_token_at is not None
    return sum(s.num_prefill_tokens for s in steps), sum(s.duration_ms for s in steps)


def test_a_repeated_prefix_is_served_from_the_cache(make_engine, recorder) -> None:
    engine = make_engine()
    system = _ids(1000, 1536)  # 24 units of 64 tokens shared
    cold, _ = _run(engine, recorder, "a", system + _ids(5, 100))
    warm, warm_prefill_ms = _run(engine, recorder, "b", system + _ids(7, 100))
    fresh, fresh_prefill_ms = _run(engine, recorder, "c", _ids(90000, 1636))
    assert cold == fresh == 1636
    assert warm == 1636 - 1536  # the shared units were not computed again
    assert warm_prefill_ms < fresh_prefill_ms / 2
    state = engine.snapshot()
    assert state.prefix_unit_tokens == UNIT
    assert state.requests == ()


def test_without_prefix_caching_nothing_is_reused_or_published(make_engine, recorder) -> None:
    engine = make_engine(enable_prefix_caching=False)
    system = _ids(1000, 1536)
    _run(engine, recorder, "a", system + _ids(5, 100))
    warm, _ = _run(engine, recorder, "b", system + _ids(7, 100))
    assert warm == 1636
    state = engine.snapshot()
    assert state.prefix_unit_tokens == 0 and state.cached_prefixes == ()


def test_the_published_state_carries_the_units_routers_hash(make_engine, recorder) -> None:
    engine = make_engine(tokenize=lambda text: [int(word) for word in text.split()])
    prompt_ids = _ids(300, 700)  # 10 full units, 60 tokens over
    text = " ".join(str(t) for t in prompt_ids)
    result = engine.submit(GenerationRequest("t", text, max_tokens=3)).result(RESULT_TIMEOUT_S)
    assert result.num_prompt_tokens == 700  # counted by the tokenizer given
    state = EngineState.from_json(engine.snapshot().to_json())  # as routers read it
    keys = chain_prefix_hashes(prefix_unit_hashes(prompt_ids, UNIT))
    assert len(keys) == 10 and set(keys) <= set(state.cached_prefixes)
    snapshot = state.to_instance_snapshot()
    assert snapshot.config.enable_prefix_caching and snapshot.config.prefix_block_size == UNIT
    assert set(keys) <= snapshot.cached_prefixes


def test_running_requests_show_what_the_cache_served_them(make_engine, recorder) -> None:
    engine = make_engine(time_scale=1.0)  # slow enough to look at while it runs
    shared = _ids(1, 640)
    _run(engine, recorder, "first", shared + _ids(9000, 10))
    future = engine.submit(GenerationRequest("second", "", max_tokens=2000,
                                             prompt_token_ids=shared + _ids(7000, 10)))
    try:
        for _ in range(200):
            states = [r for r in engine.snapshot().requests if r.request_id == "second"]
            if states and states[0].num_cached_tokens:
                break
            time.sleep(0.01)
        assert states[0].num_cached_tokens == 640
        assert states[0].to_sim_request().num_cached_tokens == 640
    finally:
        engine.abort("second")
    assert future.result(RESULT_TIMEOUT_S).finish_reason == "abort"
    # The aborted request let go of its units: they stay cached, none is held.
    pool = engine._scheduler.block_pool
    assert pool.num_in_use_blocks == 0
    assert pool.num_free == engine._instance_config.num_usable_blocks


def test_prefix_memory_publishes_in_flight_units_first_then_the_newest_finished() -> None:
    memory = PrefixMemory(unit_tokens=4, capacity_units=3, max_published=4)
    memory.finished((1, 2))
    memory.finished((3, 4))  # capacity 3: unit 1 is forgotten
    assert memory.published([]) == (4, 3, 2)
    assert memory.published([(9,)], is_cached=lambda k: k != 3) == (9, 4, 2)
    assert memory.published([(5, 6, 7, 8, 9)]) == (5, 6, 7, 8)  # capped
    assert memory.keys_of(list(range(10))) == chain_prefix_hashes(
        prefix_unit_hashes(list(range(10)), 4))
