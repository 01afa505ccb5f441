"""Latency targets in the cluster simulation: the mix, met or not, goodput and refusals."""

from __future__ import annotations

import math
import random

import pytest

from workers.cluster_sim import (
    ClusterSetup,
    LatencyTarget,
    OraclePredictor,
    TargetMix,
    Workload,
    draw_targets,
    met,
    poisson_unit_arrivals,
    simulate,
)


def test_a_mix_is_seeded_and_keeps_its_shares() -> None:
    tokens = [100] * 10_000
    mix = TargetMix(ttft_share=0.4, ttft_s=1.0, e2e_share=0.3, e2e_per_token_s=0.05,
                    e2e_slack_s=2.0)
    targets = draw_targets(tokens, mix, seed=1)
    assert targets == draw_targets(tokens, mix, seed=1) != draw_targets(tokens, mix, seed=2)
    kinds = [None if t is None else ("ttft" if t.ttft_s else "e2e") for t in targets]
    assert kinds.count("ttft") / 10_000 == pytest.approx(0.4, abs=0.02)
    assert kinds.count("e2e") / 10_000 == pytest.approx(0.3, abs=0.02)
    assert LatencyTarget(e2e_s=7.0) in targets  # 2 s + 0.05 s x 100 tokens
    with pytest.raises(ValueError):
        TargetMix(ttft_share=0.8, e2e_share=0.3)


def test_met_needs_every_target_and_a_run() -> None:
    assert met(None, 5.0, 50.0)
    assert met(LatencyTarget(ttft_s=1.0), 0.9, 50.0)
    assert not met(LatencyTarget(ttft_s=1.0, e2e_s=10.0), 0.9, 11.0)
    assert not met(None, None, None)  # refused: never ran


def _overload(n: int = 240) -> Workload:
    rng = random.Random(5)
    lengths = [(rng.randint(8, 200), rng.randint(1, 120)) for _ in range(n)]
    return Workload("test", poisson_unit_arrivals(n, 5), tuple(p for p, _ in lengths),
                    tuple(d for _, d in lengths))


def test_refusing_what_cannot_meet_its_target_raises_goodput_under_overload(
        toy_model, small_config) -> None:  # type: ignore[no-untyped-def]
    workload = _overload()
    setup = ClusterSetup(3, small_config, toy_model)
    targets = [LatencyTarget(ttft_s=0.5) for _ in range(len(workload))]
    plain = simulate(workload, 60.0, setup, "block", OraclePredictor())
    assert math.isnan(plain.goodput_rps) and plain.num_rejected == 0
    best_effort = simulate(workload, 60.0, setup, "block", OraclePredictor(), targets=targets)
    refusing = simulate(workload, 60.0, setup, "block", OraclePredictor(), targets=targets,
                        reject_unmeetable=True)
    assert best_effort.num_rejected == 0 and best_effort.num_met < len(workload)
    assert refusing.num_rejected > 0
    assert refusing.num_requests == len(workload) - refusing.num_rejected
    assert refusing.num_met > best_effort.num_met
    assert refusing.goodput_rps > best_effort.goodput_rps


def test_a_refusal_margin_refuses_only_the_clearly_hopeless(toy_model, small_config) -> None:  # type: ignore[no-untyped-def]
    workload = _overload()
    setup = ClusterSetup(3, small_config, toy_model)
    targets = [LatencyTarget(ttft_s=0.5) for _ in range(len(workload))]
    strict = simulate(workload, 60.0, setup, "block", OraclePredictor(), targets=targets,
                      reject_unmeetable=True)
    lenient = simulate(workload, 60.0, setup, "block", OraclePredictor(), targets=targets,
                       reject_unmeetable=True, refuse_margin=1.0)
    assert 0 < lenient.num_rejected < strict.num_rejected


def test_targets_can_be_measured_without_steering_the_router(toy_model, small_config) -> None:  # type: ignore[no-untyped-def]
    workload = _overload()
    setup = ClusterSetup(3, small_config, toy_model)
    targets = [LatencyTarget(ttft_s=0.5) for _ in range(len(workload))]
    plain = simulate(workload, 60.0, setup, "block", OraclePredictor(), keep_samples=True)
    measured = simulate(workload, 60.0, setup, "block", OraclePredictor(), keep_samples=True,
                        targets=targets, route_by_targets=False)
    assert (measured.ttft_s, measured.e2e_s) == (plain.ttft_s, plain.e2e_s)
    assert measured.num_met == sum(t <= 0.5 for t in plain.ttft_s) > 0
    assert not math.isnan(measured.goodput_rps)
