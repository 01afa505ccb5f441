"""The autoscaler's record in Redis and what GET /metrics makes of it."""

from __future__ import annotations

import pytest
import redis

from domain.autoscale_record import desired_instances, record_decision
from domain.metrics import AutoscaleCollector
from tests.app.test_metrics import samples

pytestmark = pytest.mark.services


def test_desired_instances_per_model_and_kind_follow_the_last_decision(
        empty_redis: redis.Redis) -> None:
    client = empty_redis
    assert samples(AutoscaleCollector(client)) == {}
    record_decision(client, "chat", "up", {"a30": 2, "h100-80gb": 1}, {"reason": "up: ..."})
    record_decision(client, "bulk", "hold", {"a30": 0}, {"reason": "hold"})
    record_decision(client, "chat", "down", {"a30": 2, "h100-80gb": 0}, {"reason": "down"})
    got = samples(AutoscaleCollector(client))
    desired = "blockq_desired_instances"
    assert got[(desired, (("gpu_kind", "a30"), ("model", "chat")))] == 2
    assert got[(desired, (("gpu_kind", "h100-80gb"), ("model", "chat")))] == 0
    assert got[(desired, (("gpu_kind", "a30"), ("model", "bulk")))] == 0
    decisions = "blockq_autoscale_decisions_total"
    assert got[(decisions, (("action", "up"), ("model", "chat")))] == 1
    assert got[(decisions, (("action", "down"), ("model", "chat")))] == 1
    # A kind the model no longer has leaves the record.
    record_decision(client, "chat", "hold", {"a30": 1}, {})
    assert [(d.model, d.gpu_kind, d.count) for d in desired_instances(client)] == [
        ("bulk", "a30", 0), ("chat", "a30", 1)]
