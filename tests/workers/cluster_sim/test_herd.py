"""Several routers deciding side by side (ClusterSetup.num_routers, decision_s): a decision sees
another router's assignment only once that one is noted, so a burst decided at once piles onto
the instance every router saw as best (the herd effect); one router deciding in turn spreads it,
and instant decisions see everything whatever the number of routers."""

from __future__ import annotations

import pytest

from workers.cluster_sim.ground_truth import SimulatedRequest
from workers.cluster_sim.simulation import ClusterSetup, FleetMember, RoutedFleet, RoutedRequest
from workers.route.pipeline import RoutingRules
from workers.route.policies import RequestView
from workers.sim import SimRequest, bundled_model
from workers.sim.hardware import instance_config

BURST = 12
PROMPT, OUTPUT = 3000, 20  # prefill-heavy: a queue of them on the A100 soon loses to an idle A30


def _fleet(num_routers: int, decision_s: float) -> RoutedFleet:
    """One A100 beside three A30s, all idle: every router's first pick is the A100."""
    kinds = ["llama-2-7b-a100", "llama-2-7b-a30", "llama-2-7b-a30", "llama-2-7b-a30"]
    members = [FleetMember(instance_config(k), bundled_model(k)) for k in kinds]
    setup = ClusterSetup.of_fleet(members, num_routers=num_routers, decision_s=decision_s,
                                  exec_noise_sigma=0.0)
    return RoutedFleet(setup, RoutingRules.of_policy("block"), seed=0)


def _arrivals(fleet: RoutedFleet, count: int, spacing_s: float) -> list[str | None]:
    """`count` requests `spacing_s` apart, each routed as it arrives; the instance each went to."""
    placed = []
    for index in range(count):
        arrival_s = index * spacing_s
        request = SimulatedRequest(f"r{index}", arrival_s, PROMPT, OUTPUT, OUTPUT)
        start = fleet.decision_start(index, arrival_s)
        fleet.advance_to(start)
        fleet.route(RoutedRequest(request, SimRequest(request.request_id, PROMPT,
                                                      predicted_output_tokens=OUTPUT),
                                  RequestView(request.request_id, PROMPT, OUTPUT,
                                              max_tokens=OUTPUT)),
                    start)
        placed.append(request.instance_id)
    return placed


def _burst(fleet: RoutedFleet) -> list[str | None]:
    """BURST requests arriving within a microsecond; the instance each went to."""
    return _arrivals(fleet, BURST, 1e-6)


def test_routers_deciding_at_once_herd_onto_the_same_instance() -> None:
    assert _burst(_fleet(num_routers=BURST, decision_s=0.005)) == ["gpu.0"] * BURST


@pytest.mark.parametrize(("num_routers", "decision_s"), [(1, 0.005), (BURST, 0.0)])
def test_decisions_that_see_each_other_spread_the_burst(num_routers: int,
                                                        decision_s: float) -> None:
    placed = _burst(_fleet(num_routers, decision_s))
    assert len(set(placed)) >= 2


def test_one_router_queues_the_burst_behind_its_decisions() -> None:
    fleet = _fleet(num_routers=1, decision_s=0.005)
    starts = [fleet.decision_start(index, index * 1e-6) for index in range(3)]
    assert starts == pytest.approx([0.0, 0.005, 0.010])


def test_a_late_note_of_a_request_the_instance_already_shows_is_dropped() -> None:
    """Many routers on a busy fleet: notes written after a publication that saw their request
    are not counted twice (a snapshot with the request twice is refused by the what-if)."""
    placed = _arrivals(_fleet(num_routers=BURST, decision_s=0.05), 4 * BURST, 0.01)
    assert None not in placed
