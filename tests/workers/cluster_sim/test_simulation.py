"""The routed cluster run: determinism, latencies, stale states, aborts; capacity."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.cluster_sim import (
    ClusterSetup,
    LogNormalPredictor,
    MeanPredictor,
    OraclePredictor,
    Workload,
    capacity_bounds,
    poisson_unit_arrivals,
    saturation_rate,
    simulate,
)
from workers.cluster_sim.simulation import p99_certainly_over
from workers.sim import InstanceConfig


def _workload(lengths: list[tuple[int, int]], seed: int = 0) -> Workload:
    return Workload("test", poisson_unit_arrivals(len(lengths), seed),
                    tuple(p for p, _ in lengths), tuple(d for _, d in lengths))


def _random_workload(n: int, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    return _workload([(rng.randint(8, 200), rng.randint(1, 120)) for _ in range(n)], seed)


# -- routed runs -------------------------------------------------------------------------------

def _setup(toy_model, small_config, **kwargs) -> ClusterSetup:  # type: ignore[no-untyped-def]
    return ClusterSetup(3, small_config, toy_model, **kwargs)


def test_a_run_is_deterministic_for_a_seed(toy_model, small_config) -> None:  # type: ignore[no-untyped-def]
    workload = _random_workload(150)
    setup = _setup(toy_model, small_config, exec_noise_sigma=0.1)
    for policy in ("random", "block", "po2_llumnix"):
        runs = [simulate(workload, 12.0, setup, policy, LogNormalPredictor(0.5), seed=seed,
                         keep_samples=True) for seed in (3, 3, 4)]
        first, again, other = runs
        assert (first.ttft_s, first.e2e_s) == (again.ttft_s, again.e2e_s)
        assert first.ttft_p99_s == again.ttft_p99_s and first.e2e_p50_s == again.e2e_p50_s
        assert first.ttft_s != other.ttft_s


def test_every_request_finishes_with_sane_latencies(toy_model, small_config) -> None:  # type: ignore[no-untyped-def]
    workload = _random_workload(200, seed=2)
    result = simulate(workload, 15.0, _setup(toy_model, small_config), "least_tokens",
                      OraclePredictor(), keep_samples=True)
    assert not result.aborted and result.num_requests == 200 == len(result.ttft_s)
    assert all(0 < t <= e for t, e in zip(result.ttft_s, result.e2e_s, strict=True))
    assert result.ttft_p50_s <= result.ttft_p99_s and result.e2e_p50_s <= result.e2e_p99_s
    assert result.throughput_rps > 0 and math.isnan(result.e2e_prediction_error_p50)


def test_block_beats_round_robin_on_a_skewed_workload(toy_model, small_config) -> None:  # type: ignore[no-untyped-def]
    # Every third request is long: round robin sends all of them to the same instance.
    lengths = [(300, 150) if i % 3 == 0 else (20, 4) for i in range(150)]
    workload = Workload("skewed", tuple(i * 0.05 for i in range(150)),
                        tuple(p for p, _ in lengths), tuple(d for _, d in lengths))
    setup = _setup(toy_model, small_config, exec_noise_sigma=0.05)
    results = {policy: simulate(workload, 1.0, setup, policy, OraclePredictor())
               for policy in ("round_robin", "block")}
    rr, block = results["round_robin"], results["block"]
    assert block.ttft_p99_s < 0.5 * rr.ttft_p99_s
    assert block.e2e_p99_s < rr.e2e_p99_s
    assert block.e2e_prediction_error_p50 < 0.2


def test_the_router_sees_stale_states_but_its_own_assignments(toy_model, small_config) -> None:  # type: ignore[no-untyped-def]
    # A burst within one publication interval: least_requests still spreads it, because the
    # ledger counts what it routed since the last snapshot.
    workload = Workload("burst", tuple(i * 1e-4 for i in range(6)), (50,) * 6, (20,) * 6)
    setup = _setup(toy_model, small_config, publish_interval_s=10.0)
    result = simulate(workload, 1.0, setup, "least_requests", OraclePredictor(),
                      keep_samples=True)
    assert result.ttft_p99_s < 0.2  # two per instance: nobody waits behind a pile-up


def test_an_overloaded_run_is_abandoned(toy_model, small_config) -> None:  # type: ignore[no-untyped-def]
    workload = _random_workload(400, seed=1)
    setup = _setup(toy_model, small_config, abort_ttft_s=1.0)
    result = simulate(workload, 100.0, setup, "round_robin", MeanPredictor())
    assert result.aborted and math.isinf(result.ttft_p99_s)


def test_a_run_is_given_up_only_when_its_e2e_target_must_be_missed(toy_model, small_config
                                                                     ) -> None:  # type: ignore[no-untyped-def]
    workload = _random_workload(400, seed=1)
    full = simulate(workload, 30.0, _setup(toy_model, small_config, abort_ttft_s=None),
                    "round_robin", MeanPredictor())
    assert not full.aborted and full.e2e_p99_s > 0.1
    below = _setup(toy_model, small_config, abort_ttft_s=None, abort_e2e_s=full.e2e_p99_s * 0.9)
    above = _setup(toy_model, small_config, abort_ttft_s=None, abort_e2e_s=full.e2e_p99_s * 1.01)
    assert simulate(workload, 30.0, below, "round_robin", MeanPredictor()).aborted
    kept = simulate(workload, 30.0, above, "round_robin", MeanPredictor())
    assert not kept.aborted and kept.e2e_p99_s == full.e2e_p99_s  # a run it keeps is the same


def test_a_router_reading_no_state_decides_alike_without_publications(
        toy_model, small_config, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Round robin's runs skip the snapshots and views nothing reads; forced to publish and
    build every view, the same run gives the same latencies, and gives up at the same point."""
    workload = _random_workload(300, seed=5)
    # NOTE: twelve instances, so that round robin leaves each alone for a while: the check for
    # giving up must still see the first tokens it made meanwhile.
    setup = ClusterSetup(12, small_config, toy_model, exec_noise_sigma=0.1, abort_ttft_s=0.3)

    def runs() -> list:  # type: ignore[type-arg]
        return [simulate(workload, rate, setup, policy, LogNormalPredictor(0.5), seed=2,
                         keep_samples=True)
                for policy in ("round_robin", "random") for rate in (20.0, 150.0)]

    skipping = runs()
    monkeypatch.setattr("workers.route.planner.reads_state", lambda _policy: True)
    monkeypatch.setattr("workers.cluster_sim.simulation.reads_state", lambda _policy: True)
    publishing = runs()
    assert [(r.aborted, r.ttft_s, r.e2e_s) for r in skipping] == [
        (r.aborted, r.ttft_s, r.e2e_s) for r in publishing]
    assert any(r.aborted for r in skipping) and not all(r.aborted for r in skipping)


@given(n=st.integers(1, 3000), data=st.data())
def test_a_certain_p99_miss_is_exact(n: int, data: st.DataObject) -> None:
    """As many values above the limit as the rule asks put NumPy's p99 above it, whatever the
    rest; one fewer does not when the rest are far below and the late ones just above (the
    p99 then interpolates between a value below and one above)."""
    late = data.draw(st.integers(0, n))
    values = np.concatenate([np.zeros(n - late), np.full(late, 1.0 + 1e-6)])
    assert p99_certainly_over(late, n) == (np.percentile(values, 99) > 1.0)


# -- capacity -------------------------------------------------------------------------------

def test_capacity_bounds() -> None:
    p99 = {20.0: 1.0, 22.0: 2.5, 24.0: 3.5, 26.0: 2.9, 28.0: 9.0}
    assert capacity_bounds(p99, 3.0) == (22.0, 24.0)  # 26 passes by luck above a failure
    assert capacity_bounds(p99, 10.0) == (28.0, None)
    assert capacity_bounds(p99, 0.5) == (None, 20.0)
    assert capacity_bounds({20.0: math.inf}, 3.0) == (None, 20.0)


def test_every_ground_truth_takes_prefix_caching(toy_model) -> None:  # type: ignore[no-untyped-def]
    config = InstanceConfig(65, 16, 8, 128, 512, enable_prefix_caching=True)
    for ground_truth in ("ours", "vllm", "vllm-async"):
        assert ClusterSetup(2, config, toy_model, ground_truth=ground_truth).config is config


def test_saturation_rate_is_the_throughput_of_a_full_queue(toy_model, small_config) -> None:  # type: ignore[no-untyped-def]
    workload = _workload([(16, 10)] * 16)
    # 8 at a time (max_num_seqs): one 128-token prefill step, then 9 decode steps of 8.
    rate = saturation_rate(workload, small_config, toy_model)
    decodes_ms = sum(toy_model.step_ms_of(0, 8, 0, 8 * (17 + i), 0, 0) for i in range(9))
    assert 16 / rate == pytest.approx(2 * (toy_model.step_ms_of(128, 0, 8, 0, 0, 0)
                                           + decodes_ms) / 1000)
