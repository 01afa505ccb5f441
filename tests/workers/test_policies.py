"""Routing policies: pure decisions over instance views."""

from __future__ import annotations

import random

import pytest

from workers.route.policies import POLICIES, InstanceView, RequestView, RoutingContext, decide

REQUEST = RequestView("req_1", num_prompt_tokens=10, predicted_output_tokens=20, max_tokens=64)


def _inst(instance_id: str, running: int = 0, waiting: int = 0, assigned: int = 0) -> InstanceView:
    return InstanceView(
        instance_id, running, waiting, assigned, num_free_blocks=100, num_total_blocks=100
    )


def _ctx(ticket: int = 0, seed: int = 0) -> RoutingContext:
    return RoutingContext(ticket=ticket, rng=random.Random(seed))


def test_round_robin_cycles_in_id_order_whatever_the_input_order() -> None:
    fleet = [_inst("gpu.2"), _inst("gpu.0"), _inst("gpu.1")]
    chosen = [decide("round_robin", REQUEST, fleet, _ctx(t)).instance_id for t in range(6)]
    assert chosen == ["gpu.0", "gpu.1", "gpu.2"] * 2


def test_least_requests_counts_running_waiting_and_unadmitted_assignments() -> None:
    fleet = [
        _inst("gpu.0", running=2),
        _inst("gpu.1", running=1, assigned=2),
        _inst("gpu.2", waiting=1),
    ]
    decision = decide("least_requests", REQUEST, fleet, _ctx())
    assert decision.instance_id == "gpu.2"
    assert decision.scores == {"gpu.0": 2.0, "gpu.1": 3.0, "gpu.2": 1.0}
    assert decision.policy == "least_requests"


def test_ties_are_broken_at_random() -> None:
    fleet = [_inst("gpu.0"), _inst("gpu.1")]
    winners = {
        decide("least_requests", REQUEST, fleet, _ctx(seed=s)).instance_id for s in range(20)
    }
    assert winners == {"gpu.0", "gpu.1"}


def test_unknown_policy_names_the_known_ones_and_empty_fleet_raises() -> None:
    with pytest.raises(ValueError, match="least_requests, round_robin"):
        decide("fastest", REQUEST, [_inst("gpu.0")], _ctx())
    with pytest.raises(ValueError, match="no candidate"):
        decide("round_robin", REQUEST, [], _ctx())


def test_duplicate_registration_raises() -> None:
    with pytest.raises(ValueError, match="already registered"):
        POLICIES.register("round_robin")(type("Again", (), {}))
