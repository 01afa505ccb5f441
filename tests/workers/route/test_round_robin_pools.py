"""Round robin takes turns within each model's pool: with one counter for the whole fleet,
another model's requests took tickets in between and a model's two instances got its requests
in a random order (the live proof of a plan saw chat's TTFT p99 at three times the planner's
prediction, which takes turns in each pool). Real Redis, as every router shares it."""

from __future__ import annotations

import random
import time

import pytest
import redis

from domain.live_fleet import Fleet
from domain.settings import Settings
from tests.engine_states import engine_state
from workers.route import pipeline
from workers.route.policies import RequestView
from workers.route.stage import routing_rules

pytestmark = pytest.mark.services

POOLS = {"gpu.0": "chat", "gpu.1": "chat", "gpu.2": "bulk", "gpu.3": "bulk", "gpu.4": "bulk"}


def test_each_models_requests_take_turns_on_its_own_instances(fresh_services: Settings) -> None:
    fleet = Fleet(redis.Redis.from_url(fresh_services.redis_url), heartbeat_ttl_s=60)
    for instance, model in POOLS.items():
        fleet.publish(instance, engine_state(model=model, taken_at=time.time()))
    statuses, _ = fleet.routing_view()
    rules = routing_rules(fresh_services.model_copy(update={"routing_policy": "round_robin"}))
    picks: dict[str, list[str]] = {"chat": [], "bulk": []}
    arrivals = random.Random(7).choices(["chat", "bulk"], k=60)  # interleaved as they come
    for number, model in enumerate(arrivals):
        outcome = pipeline.decide_route(
            pipeline.RouteRequest(RequestView(f"r{number}", 100, 50, 200), model=model),
            pipeline.FleetRead(statuses), rules,
            pipeline.DecisionContext(now=time.time(), rng=random.Random(number),
                                     next_ticket=fleet.next_round_robin,
                                     exec_models=lambda _candidates: {}))
        assert isinstance(outcome, pipeline.Routed)
        assert POOLS[outcome.instance_id] == model
        picks[model].append(outcome.instance_id)
    for model, instances in picks.items():
        size = sum(1 for m in POOLS.values() if m == model)
        cycle = instances[:size]
        assert sorted(cycle) == sorted(i for i, m in POOLS.items() if m == model)
        assert instances == (cycle * len(instances))[:len(instances)], model
