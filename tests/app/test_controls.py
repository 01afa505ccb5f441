"""Operator controls outlive a Redis restart: the database keeps holds and the routing-policy
override, and a restore (the health sweep runs one each time) puts them back in Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from domain.controls import OperatorControls
from domain.db import Database
from domain.live_fleet import Fleet
from domain.settings import Settings
from tests.engine_states import engine_state

pytestmark = pytest.mark.services


@pytest.fixture
def controls(fresh_services: Settings) -> Iterator[OperatorControls]:
    db = Database(fresh_services.resolved_database_url)
    fleet = Fleet(redis.Redis.from_url(fresh_services.redis_url), heartbeat_ttl_s=5)
    yield OperatorControls(db, fleet)
    db.dispose()


def restart_redis(fleet: Fleet) -> None:
    """What a restart of the local Redis (nothing on disk) does: everything is gone; the
    engines publish again."""
    fleet.redis.flushdb()
    fleet.publish("gpu.0", engine_state())
    fleet.publish("gpu.1", engine_state())


def test_holds_and_the_policy_override_come_back_after_a_redis_restart(
    controls: OperatorControls
) -> None:
    fleet = controls.fleet
    restart_redis(fleet)
    controls.hold("gpu.0", "drained")
    controls.set_policy_override("least_requests")
    restart_redis(fleet)
    assert [s.control for s in fleet.statuses()] == [None, None]  # what routers saw before

    controls.restore()
    assert [s.control for s in fleet.statuses()] == ["drained", None]
    assert [s.instance_id for s in fleet.routable()] == ["gpu.1"]
    assert fleet.policy_override() == "least_requests"
    statuses, override = fleet.routing_view()  # what a routing decision reads
    assert [s.instance_id for s in statuses if s.routable] == ["gpu.1"]
    assert override == "least_requests"


def test_a_release_is_restored_too(controls: OperatorControls) -> None:
    fleet = controls.fleet
    restart_redis(fleet)
    controls.hold("gpu.1", "paused")
    controls.hold("gpu.1", None)
    controls.set_policy_override(None)
    fleet.hold("gpu.1", "paused")  # a stale copy: the release reached only the database
    controls.restore()
    assert [s.control for s in fleet.statuses()] == [None, None]
    assert fleet.policy_override() is None
    assert fleet.routing_view()[1] is None
