"""Routing policies: pure decisions over instance views, and the inputs callers compute."""

from __future__ import annotations

import random

import pytest

from workers.route.policies import (
    POLICIES,
    PROBE_COUNTS,
    SCORING_POLICIES,
    FleetLedger,
    InstanceView,
    RequestView,
    RoutingContext,
    decide,
    instance_view,
    needs_what_if,
    predict_what_ifs,
    prepare_published,
    target_shortfall,
)
from workers.sim import ExecModel, InstanceConfig, InstanceSnapshot, SimRequest

REQUEST = RequestView("req_1", num_prompt_tokens=10, predicted_output_tokens=20, max_tokens=64)


def _inst(instance_id: str, running: int = 0, waiting: int = 0, assigned: int = 0,
          free: int = 100, **extra: object) -> InstanceView:
    return InstanceView(instance_id, running, waiting, assigned, num_free_blocks=free,
                        num_total_blocks=100, **extra)  # type: ignore[arg-type]


def _ctx(ticket: int = 0, seed: int = 0) -> RoutingContext:
    return RoutingContext(ticket=ticket, rng=random.Random(seed))


# -- each policy's choice -------------------------------------------------------------------

def test_round_robin_cycles_in_id_order_whatever_the_input_order() -> None:
    fleet = [_inst("gpu.2"), _inst("gpu.0"), _inst("gpu.1")]
    chosen = [decide("round_robin", REQUEST, fleet, _ctx(t)).instance_id for t in range(6)]
    assert chosen == ["gpu.0", "gpu.1", "gpu.2"] * 2


def test_random_draws_every_instance_and_scores_them_all_equal() -> None:
    fleet = [_inst("gpu.0", running=9), _inst("gpu.1"), _inst("gpu.2")]
    decisions = [decide("random", REQUEST, fleet, _ctx(seed=s)) for s in range(40)]
    assert {d.instance_id for d in decisions} == {"gpu.0", "gpu.1", "gpu.2"}
    assert decisions[0].scores == {"gpu.0": 0.0, "gpu.1": 0.0, "gpu.2": 0.0}


def test_least_requests_counts_running_waiting_and_unadmitted_assignments() -> None:
    fleet = [_inst("gpu.0", running=2), _inst("gpu.1", running=1, assigned=2),
             _inst("gpu.2", waiting=1)]
    decision = decide("least_requests", REQUEST, fleet, _ctx())
    assert decision.instance_id == "gpu.2"
    assert decision.scores == {"gpu.0": 2.0, "gpu.1": 3.0, "gpu.2": 1.0}
    assert decision.policy == "least_requests"


def test_infaas_picks_most_free_blocks_per_running_request() -> None:
    fleet = [_inst("gpu.0", running=4, free=100),  # 25 per request
             _inst("gpu.1", running=2, free=60),  # 30
             _inst("gpu.2", running=1, assigned=2, free=60)]  # 20: assigned ones will run
    decision = decide("infaas", REQUEST, fleet, _ctx())
    assert decision.instance_id == "gpu.1"
    assert decision.scores == {"gpu.0": -25.0, "gpu.1": -30.0, "gpu.2": -20.0}


def test_llumnix_freeness_subtracts_waiting_prompt_blocks_and_divides_by_running() -> None:
    fleet = [_inst("gpu.0", running=2, free=100, num_waiting_prompt_blocks=40),  # 30
             _inst("gpu.1", running=4, free=100),  # 25
             _inst("gpu.2", running=0, free=50, num_waiting_prompt_blocks=15)]  # 35 / max(0, 1)
    decision = decide("llumnix", REQUEST, fleet, _ctx())
    assert decision.instance_id == "gpu.2"
    assert decision.scores == {"gpu.0": -30.0, "gpu.1": -25.0, "gpu.2": -35.0}


def test_least_tokens_picks_least_outstanding_predicted_tokens_and_needs_them() -> None:
    fleet = [_inst("gpu.0", num_outstanding_tokens=900), _inst("gpu.1", num_outstanding_tokens=300),
             _inst("gpu.2", running=0, num_outstanding_tokens=301)]
    assert decide("least_tokens", REQUEST, fleet, _ctx()).instance_id == "gpu.1"
    with pytest.raises(ValueError, match="num_outstanding_tokens"):
        decide("least_tokens", REQUEST, [_inst("gpu.0")], _ctx())


def test_block_minimises_end_to_end_and_block_ttft_minimises_first_token() -> None:
    fleet = [_inst("gpu.0", what_if_ttft_s=0.5, what_if_e2e_s=4.0),
             _inst("gpu.1", what_if_ttft_s=0.1, what_if_e2e_s=6.0),
             _inst("gpu.2", what_if_ttft_s=0.3, what_if_e2e_s=5.0)]
    block = decide("block", REQUEST, fleet, _ctx())
    assert block.instance_id == "gpu.0"
    assert block.scores == {"gpu.0": 4.0, "gpu.1": 6.0, "gpu.2": 5.0}
    assert decide("block_ttft", REQUEST, fleet, _ctx()).instance_id == "gpu.1"


def test_block_harm_adds_the_delay_to_the_others_to_the_end_to_end_latency() -> None:
    fleet = [_inst("gpu.0", what_if_ttft_s=0.1, what_if_e2e_s=4.0,
                   what_if_delay_to_others_s=3.0),   # block's pick, but delays 3 s of others
             _inst("gpu.1", what_if_ttft_s=0.6, what_if_e2e_s=5.0,
                   what_if_delay_to_others_s=1.0)]
    assert decide("block", REQUEST, fleet, _ctx()).instance_id == "gpu.0"
    harm = decide("block_harm", REQUEST, fleet, _ctx())
    assert harm.instance_id == "gpu.1" and harm.scores == {"gpu.0": 7.0, "gpu.1": 6.0}
    with pytest.raises(ValueError, match="what_if_delay_to_others_s"):
        decide("block_harm", REQUEST, [_inst("gpu.0", what_if_ttft_s=0.1, what_if_e2e_s=1.0)],
               _ctx())


def test_block_affinity_prefers_the_longest_cached_prefix_within_its_margin() -> None:
    fleet = [_inst("gpu.0", what_if_e2e_s=10.0),
             _inst("gpu.1", what_if_e2e_s=11.5, prefix_match_tokens=768),  # within 20 %
             _inst("gpu.2", what_if_e2e_s=11.0, prefix_match_tokens=256)]
    assert decide("block", REQUEST, fleet, _ctx()).instance_id == "gpu.0"
    assert decide("block_affinity", REQUEST, fleet, _ctx()).instance_id == "gpu.1"
    slower = [fleet[0], _inst("gpu.1", what_if_e2e_s=12.5, prefix_match_tokens=768), fleet[2]]
    assert decide("block_affinity", REQUEST, slower, _ctx()).instance_id == "gpu.0"
    unmatched = [_inst("gpu.0", what_if_e2e_s=10.0), _inst("gpu.1", what_if_e2e_s=9.0)]
    assert decide("block_affinity", REQUEST, unmatched, _ctx()).instance_id == "gpu.1"


def test_block_policies_refuse_views_without_what_ifs() -> None:
    for name in ("block", "block_ttft", "block_affinity", "po2_block"):
        with pytest.raises(ValueError, match="what_if"):
            decide(name, REQUEST, [_inst("gpu.0"), _inst("gpu.1")], _ctx())


def test_which_policies_need_what_ifs() -> None:
    simulating = {n for n in POLICIES.names() if needs_what_if(n)}
    assert simulating == {"block", "block_ttft", "block_harm", "block_affinity", "block_slo",
                          *(f"po{k}_{p}" for k in PROBE_COUNTS
                            for p in ("block", "block_ttft", "block_slo"))}


# -- power of k -------------------------------------------------------------------------------

def test_power_of_k_scores_k_random_candidates_and_picks_their_best() -> None:
    fleet = [_inst(f"gpu.{i}", running=i) for i in range(8)]
    seen = set()
    for seed in range(60):
        for k in PROBE_COUNTS:
            decision = decide(f"po{k}_least_requests", REQUEST, fleet, _ctx(seed=seed))
            assert len(decision.scores) == k
            assert decision.scores[decision.instance_id] == min(decision.scores.values())
            seen.add(decision.instance_id)
    assert len(seen) > 4  # not always the global best (gpu.0)


def test_power_of_k_probes_everyone_in_a_small_fleet() -> None:
    fleet = [_inst("gpu.0", running=3), _inst("gpu.1", running=1)]
    decision = decide("po4_least_requests", REQUEST, fleet, _ctx())
    assert decision.instance_id == "gpu.1" and set(decision.scores) == {"gpu.0", "gpu.1"}


def test_every_scoring_policy_has_power_of_k_variants() -> None:
    names = set(POLICIES.names())
    assert {f"po{k}_{p}" for k in PROBE_COUNTS for p in SCORING_POLICIES} <= names


@pytest.mark.parametrize("name", POLICIES.names())
def test_every_policy_scores_every_candidate_it_considers(name: str) -> None:
    fleet = [_inst(f"gpu.{i}", running=i, free=100 - i, num_outstanding_tokens=10 * i,
                   what_if_ttft_s=0.1 * i, what_if_e2e_s=1.0 + i,
                   what_if_delay_to_others_s=0.5 * i, what_if_preemptions=i % 2)
             for i in range(5)]
    decision = decide(name, REQUEST, fleet, _ctx(ticket=3, seed=1))
    assert decision.policy == name
    assert decision.instance_id in decision.scores
    assert set(decision.scores) <= {i.instance_id for i in fleet}
    assert len(decision.scores) == (int(name[2]) if name.startswith("po") else 5)


# -- tie breaks and misuse ------------------------------------------------------------------

def test_ties_are_broken_at_random() -> None:
    fleet = [_inst("gpu.0"), _inst("gpu.1")]
    winners = {decide("least_requests", REQUEST, fleet, _ctx(seed=s)).instance_id
               for s in range(20)}
    assert winners == {"gpu.0", "gpu.1"}


def test_unknown_policy_names_the_known_ones_and_empty_fleet_raises() -> None:
    with pytest.raises(ValueError, match="block, block_affinity, block_harm, block_slo, "
                                         "block_ttft, capacity_weighted, infaas"):
        decide("fastest", REQUEST, [_inst("gpu.0")], _ctx())
    with pytest.raises(ValueError, match="no candidate"):
        decide("round_robin", REQUEST, [], _ctx())


def test_duplicate_registration_raises() -> None:
    with pytest.raises(ValueError, match="already registered"):
        POLICIES.register("round_robin")(type("Again", (), {}))


# -- views and what-ifs from published states ------------------------------------------------

CONFIG = InstanceConfig(num_total_blocks=101, block_size=16, max_num_seqs=8,
                        max_num_batched_tokens=256, max_model_len=1024)


def _snapshot(*requests: SimRequest, free: int = 80) -> InstanceSnapshot:
    return InstanceSnapshot(CONFIG, free, requests)


def test_instance_view_counts_load_from_the_snapshot_and_the_assigned_requests() -> None:
    snapshot = _snapshot(
        SimRequest("a", 40, num_computed_tokens=49, num_output_tokens=10,
                   predicted_output_tokens=30, is_running=True),  # 1 + 20 outstanding
        SimRequest("b", 20, num_computed_tokens=8, predicted_output_tokens=5,
                   is_running=True),  # 12 prompt + 5 output
        SimRequest("c", 33, predicted_output_tokens=7),  # waiting: 3 blocks, 40 tokens
    )
    assigned = [SimRequest("d", 16, predicted_output_tokens=4)]  # 1 block, 20 tokens
    view = instance_view("gpu.0", snapshot, assigned)
    assert (view.num_running, view.num_waiting, view.num_assigned) == (2, 1, 1)
    assert (view.num_free_blocks, view.num_total_blocks) == (80, 101)
    assert view.num_waiting_prompt_blocks == 3 + 1
    assert view.num_outstanding_tokens == 21 + 17 + 40 + 20
    assert view.what_if_e2e_s is None


def test_outstanding_tokens_follow_the_planned_lengths() -> None:
    short = instance_view("gpu.0", _snapshot(SimRequest("a", 16, predicted_output_tokens=10)))
    long = instance_view("gpu.0", _snapshot(SimRequest("a", 16, predicted_output_tokens=100)))
    assert long.num_outstanding_tokens - short.num_outstanding_tokens == 90


def test_what_ifs_use_the_length_the_request_carries(toy_model) -> None:  # type: ignore[no-untyped-def]
    prepared = {"gpu.0": prepare_published(_snapshot())}
    predicted = predict_what_ifs(SimRequest("new", 32, predicted_output_tokens=10), prepared,
                                 toy_model)
    oracle = predict_what_ifs(SimRequest("new", 32, predicted_output_tokens=50), prepared,
                              toy_model)
    assert predicted["gpu.0"].ttft_s == oracle["gpu.0"].ttft_s
    assert oracle["gpu.0"].e2e_s > predicted["gpu.0"].e2e_s


def test_assigned_requests_queue_ahead_of_the_new_one(toy_model) -> None:  # type: ignore[no-untyped-def]
    new = SimRequest("new", 32, predicted_output_tokens=10)
    alone = predict_what_ifs(new, {"i": prepare_published(_snapshot())}, toy_model)["i"]
    behind = predict_what_ifs(new, {"i": prepare_published(
        _snapshot(), [SimRequest("x", 200, predicted_output_tokens=50)])}, toy_model)["i"]
    assert behind.ttft_s > alone.ttft_s and behind.e2e_s > alone.e2e_s


def test_ledger_makes_an_assignment_visible_to_the_next_decision(toy_model) -> None:  # type: ignore[no-untyped-def]
    ledger = FleetLedger()
    for instance_id in ("gpu.0", "gpu.1"):
        ledger.publish(instance_id, _snapshot(free=CONFIG.num_usable_blocks), 0.0)
    first = SimRequest("r1", 200, predicted_output_tokens=100)
    views = ledger.views(first, toy_model)
    assert views[0].what_if_e2e_s == views[1].what_if_e2e_s
    decision = decide("block", RequestView("r1", 200, 100, 800), views, _ctx())
    ledger.assign(decision.instance_id, first, 0.01)
    second = SimRequest("r2", 200, predicted_output_tokens=100)
    views = {v.instance_id: v for v in ledger.views(second, toy_model)}
    other = "gpu.1" if decision.instance_id == "gpu.0" else "gpu.0"
    assert views[decision.instance_id].num_assigned == 1
    assert views[decision.instance_id].what_if_e2e_s > views[other].what_if_e2e_s
    assert decide("block", RequestView("r2", 200, 100, 800), list(views.values()),
                  _ctx()).instance_id == other


def test_ledger_drops_assignments_a_newer_snapshot_shows() -> None:
    ledger = FleetLedger()
    ledger.publish("gpu.0", _snapshot(), 0.0)
    for name, at in (("a", 0.01), ("b", 0.02), ("c", 0.05)):
        ledger.assign("gpu.0", SimRequest(name, 16, predicted_output_tokens=4), at)
    assert [r.request_id for r in ledger.assigned("gpu.0")] == ["a", "b", "c"]
    # Published at 0.03: "a" shows as waiting; "b" was routed before (it may have finished).
    ledger.publish("gpu.0", _snapshot(SimRequest("a", 16, predicted_output_tokens=4)), 0.03)
    assert [r.request_id for r in ledger.assigned("gpu.0")] == ["c"]
    view = ledger.views()[0]
    assert (view.num_waiting, view.num_assigned) == (1, 1)


def test_ledger_refuses_unknown_instances_and_what_ifs_without_a_request(toy_model) -> None:  # type: ignore[no-untyped-def]
    ledger = FleetLedger()
    with pytest.raises(ValueError, match="published no state"):
        ledger.assign("gpu.9", SimRequest("a", 16, predicted_output_tokens=4), 0.0)
    ledger.publish("gpu.0", _snapshot(), 0.0)
    with pytest.raises(ValueError, match="request"):
        ledger.views(None, toy_model)


# -- latency targets ------------------------------------------------------------------------

def _simulated(instance_id: str, ttft: float, e2e: float, harm: float) -> InstanceView:
    return _inst(instance_id, what_if_ttft_s=ttft, what_if_e2e_s=e2e,
                 what_if_delay_to_others_s=harm)


TARGETED = RequestView("req_t", num_prompt_tokens=10, predicted_output_tokens=20, max_tokens=64,
                       ttft_target_s=1.0, e2e_target_s=10.0)


def test_a_target_picks_the_instance_meeting_it_that_delays_the_others_least() -> None:
    fleet = [_simulated("gpu.0", ttft=0.2, e2e=5.0, harm=9.0),   # block's pick: fastest
             _simulated("gpu.1", ttft=0.8, e2e=8.0, harm=1.0),   # meets both, least harm
             _simulated("gpu.2", ttft=1.5, e2e=6.0, harm=0.0)]   # misses the TTFT target
    decision = decide("block", TARGETED, fleet, _ctx())
    assert (decision.instance_id, decision.meets_target) == ("gpu.1", True)
    # The same request without targets: block's own choice, and no verdict.
    plain = decide("block", REQUEST, fleet, _ctx())
    assert (plain.instance_id, plain.meets_target) == ("gpu.0", None)


def test_when_no_instance_meets_the_target_the_closest_wins_and_says_so() -> None:
    fleet = [_simulated("gpu.0", ttft=2.0, e2e=5.0, harm=0.0),    # block's pick; TTFT 2x
             _simulated("gpu.1", ttft=1.2, e2e=12.0, harm=0.0)]   # 1.2x both: closest
    decision = decide("block", TARGETED, fleet, _ctx())
    assert (decision.instance_id, decision.meets_target) == ("gpu.1", False)
    assert decision.scores == {"gpu.0": 5.0, "gpu.1": 12.0}  # the policy's scores, unchanged
    # Equally close: the policy's score breaks the tie.
    tied = [_simulated("gpu.0", ttft=1.5, e2e=9.0, harm=0.0),
            _simulated("gpu.1", ttft=1.5, e2e=8.0, harm=0.0)]
    assert decide("block", TARGETED, tied, _ctx()).instance_id == "gpu.1"
    only_e2e = RequestView("r", 10, 20, 64, e2e_target_s=5.0)
    assert decide("block", only_e2e, fleet, _ctx()).meets_target is True


def test_targets_are_not_read_by_policies_that_do_not_simulate() -> None:
    decision = decide("least_requests", TARGETED, [_inst("gpu.0"), _inst("gpu.1", running=1)],
                      _ctx())
    assert (decision.instance_id, decision.meets_target) == ("gpu.0", None)


def test_the_shortfall_is_the_best_instances_worst_ratio_to_the_targets() -> None:
    fleet = [_simulated("gpu.0", ttft=2.0, e2e=5.0, harm=0.0),    # TTFT 2x its target
             _simulated("gpu.1", ttft=1.2, e2e=12.0, harm=0.0)]   # 1.2x both
    assert target_shortfall(TARGETED, fleet) == pytest.approx(1.2)
    assert target_shortfall(REQUEST, fleet) is None  # no target
    assert target_shortfall(TARGETED, [_inst("gpu.0")]) is None  # no what-if


# -- fleets of unlike instances -------------------------------------------------------------

def test_capacity_weighted_divides_the_backlog_by_each_instances_throughput() -> None:
    # gpu.0 is three times as fast: three times the backlog still drains sooner.
    fleet = [_inst("gpu.0", num_outstanding_tokens=2_500, throughput_rps=9.0),
             _inst("gpu.1", num_outstanding_tokens=900, throughput_rps=3.0)]
    decision = decide("capacity_weighted", REQUEST, fleet, _ctx())
    assert decision.instance_id == "gpu.0"
    own = REQUEST.num_prompt_tokens + REQUEST.predicted_output_tokens
    assert decision.scores == {"gpu.0": pytest.approx((2_500 + own) / 9.0),
                               "gpu.1": pytest.approx((900 + own) / 3.0)}
    # Without throughputs every instance weighs the same: least outstanding tokens.
    plain = [_inst("gpu.0", num_outstanding_tokens=2_500), _inst("gpu.1",
                                                                 num_outstanding_tokens=900)]
    assert decide("capacity_weighted", REQUEST, plain, _ctx()).instance_id == "gpu.1"


def test_capacity_weighted_avoids_an_instance_whose_kv_cache_would_not_hold_the_request() -> None:
    # gpu.0 drains sooner but its free blocks are all claimed by its waiting requests.
    fleet = [_inst("gpu.0", free=10, num_waiting_prompt_blocks=10, num_outstanding_tokens=1_000,
                   throughput_rps=6.0),
             _inst("gpu.1", free=50, num_outstanding_tokens=1_000, throughput_rps=4.0)]
    assert decide("capacity_weighted", REQUEST, fleet, _ctx()).instance_id == "gpu.1"
    fleet[0] = _inst("gpu.0", free=10, num_outstanding_tokens=1_000, throughput_rps=6.0)
    assert decide("capacity_weighted", REQUEST, fleet, _ctx()).instance_id == "gpu.0"


def test_ledger_simulates_each_instance_on_its_own_model_and_keeps_its_throughput(
        toy_model) -> None:  # type: ignore[no-untyped-def]
    fast = ExecModel("fast", toy_model.token_knots,
                     {k: v / 2 for k, v in toy_model.coefficients_ms.items()})
    ledger = FleetLedger()
    for instance_id in ("gpu.0", "gpu.1"):
        ledger.publish(instance_id, _snapshot(free=CONFIG.num_usable_blocks), 0.0)
    ledger.set_throughput("gpu.0", 8.0)
    request = SimRequest("r1", 200, predicted_output_tokens=100)
    views = ledger.views(request, {"gpu.0": fast, "gpu.1": toy_model})
    assert views[0].what_if_e2e_s == pytest.approx(views[1].what_if_e2e_s / 2)
    assert (views[0].throughput_rps, views[1].throughput_rps) == (8.0, None)
    # A new publication keeps the instance's throughput.
    ledger.publish("gpu.0", _snapshot(free=CONFIG.num_usable_blocks), 1.0)
    assert ledger.views()[0].throughput_rps == 8.0


def test_block_slo_charges_the_preemptions_the_what_if_runs_into() -> None:
    # gpu.0 starts the request sooner, but its KV cache runs out while it decodes.
    fleet = [_inst("gpu.0", what_if_ttft_s=0.05, what_if_e2e_s=9.0, what_if_preemptions=2),
             _inst("gpu.1", what_if_ttft_s=0.30, what_if_e2e_s=6.0, what_if_preemptions=0)]
    decision = decide("block_slo", REQUEST, fleet, _ctx())
    assert decision.instance_id == "gpu.1"
    assert decision.scores["gpu.0"] == pytest.approx(0.05 + 2 * 1.0)
    assert decide("block_ttft", REQUEST, fleet, _ctx()).instance_id == "gpu.0"
    # Without preemptions anywhere it is block_ttft.
    calm = [_inst("gpu.0", what_if_ttft_s=0.05, what_if_e2e_s=9.0, what_if_preemptions=0),
            _inst("gpu.1", what_if_ttft_s=0.30, what_if_e2e_s=6.0, what_if_preemptions=0)]
    assert decide("block_slo", REQUEST, calm, _ctx()).instance_id == "gpu.0"
    with pytest.raises(ValueError, match="what_if_preemptions"):
        decide("block_slo", REQUEST, [_inst("gpu.0", what_if_ttft_s=0.1)], _ctx())


def test_the_ledger_hands_the_what_ifs_preemptions_to_the_policies(toy_model) -> None:  # type: ignore[no-untyped-def]
    ledger = FleetLedger()
    ledger.publish("gpu.0", _snapshot(free=CONFIG.num_usable_blocks), 0.0)
    (view,) = ledger.views(SimRequest("r1", 200, predicted_output_tokens=100), toy_model)
    assert view.what_if_preemptions == 0
