"""The state publisher asks for a release of held requests (late binding) when it publishes
room while the router holds some: on the real Redis, with a real emulated engine."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from domain.live_fleet import Fleet
from domain.settings import Settings
from tests.environment import free_port
from tests.redis_server import RedisServer, eventually
from workers.serve.emulated_engine import EmulatedEngine
from workers.serve.engine import GenerationRequest
from workers.serve.publisher import StatePublisher


@pytest.fixture
def fleet(fresh_services: Settings) -> Fleet:
    return Fleet(redis.Redis.from_url(fresh_services.redis_url), heartbeat_ttl_s=5.0)


def _asks(engine: EmulatedEngine, fleet: Fleet) -> bool:
    asked: list[bool] = []
    StatePublisher("gpu.0", "m", engine, fleet, interval_s=1.0,
                   on_room=lambda: asked.append(True)).publish_once()
    return bool(asked)


@pytest.mark.parametrize("holding", [True, False])
def test_an_idle_engine_asks_only_while_requests_are_held(
        make_emulated_engine: Callable[..., EmulatedEngine], fleet: Fleet,
        holding: bool) -> None:
    if holding:
        fleet.hold_request("req_held", time.time())
    assert _asks(make_emulated_engine(), fleet) is holding


def test_an_engine_without_a_free_seat_does_not_ask(
        make_emulated_engine: Callable[..., EmulatedEngine], fleet: Fleet) -> None:
    engine = make_emulated_engine(max_num_seqs=1, time_scale=1.0)
    engine.submit(GenerationRequest("req_long", "x" * 200, max_tokens=2000))
    deadline = time.monotonic() + 5
    while engine.snapshot().num_running == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    fleet.hold_request("req_held", time.time())
    assert engine.snapshot().num_running == 1
    assert not _asks(engine, fleet)



def test_an_instance_that_starts_while_redis_is_down_is_announced_once_it_answers(
        make_emulated_engine: Callable[..., EmulatedEngine], tmp_path: Path) -> None:
    """Found by the chaos run: an engine worker restarted while Redis restarted exited at its
    first publication. It now starts, is announced when Redis answers, and withdraws and stops
    without it."""
    server = RedisServer(free_port(), tmp_path)
    # No retries with backoff while Redis is down: each call fails at once.
    fleet = Fleet(redis.Redis(port=server.port, socket_connect_timeout=0.2, socket_timeout=1,
                              retry=Retry(NoBackoff(), 0)), heartbeat_ttl_s=5.0)
    publisher = StatePublisher("gpu.0", "m", make_emulated_engine(), fleet, interval_s=0.05)
    try:
        publisher.start()  # Redis is not running yet
        server.start()
        assert eventually(lambda: any(s.alive for s in fleet.statuses()), timeout_s=10)
        server.kill()
        publisher.withdraw()
        publisher.signal_stop()
    finally:
        publisher.signal_stop()
        publisher.join()
        server.kill()
