"""Late binding: when an instance would start a request, and the cluster run that holds them."""

from __future__ import annotations

import random

import pytest

from workers.cluster_sim import ClusterSetup, OraclePredictor, Workload, simulate
from workers.cluster_sim.workload import poisson_unit_arrivals
from workers.route.late_binding import LateBinding
from workers.route.policies import InstanceView
from workers.sim import InstanceConfig

CONFIG = InstanceConfig(num_total_blocks=100, block_size=16, max_num_seqs=4,
                        max_num_batched_tokens=128, max_model_len=512)


def _view(running: int = 0, waiting: int = 0, assigned: int = 0, free: int = 100,
          waiting_blocks: int = 0, queueing_s: float | None = None) -> InstanceView:
    return InstanceView("gpu.0", running, waiting, assigned, num_free_blocks=free,
                        num_total_blocks=100, num_waiting_prompt_blocks=waiting_blocks,
                        what_if_queueing_s=queueing_s)


def test_an_instance_without_a_seat_would_not_start_it() -> None:
    rule = LateBinding(kv_reserve=0.0)
    assert rule.would_start(_view(running=3), 64, CONFIG)
    assert not rule.would_start(_view(running=3, assigned=1), 64, CONFIG)
    assert not rule.would_start(_view(running=2, waiting=2), 64, CONFIG)


def test_the_prompt_must_fit_beside_the_waiting_ones_and_the_reserve() -> None:
    # 64 prompt tokens are 4 blocks of 16.
    assert LateBinding(kv_reserve=0.0).would_start(_view(free=10, waiting_blocks=6), 64, CONFIG)
    assert not LateBinding(kv_reserve=0.0).would_start(_view(free=10, waiting_blocks=7), 64,
                                                       CONFIG)
    assert not LateBinding(kv_reserve=0.05).would_start(_view(free=10, waiting_blocks=6), 64,
                                                        CONFIG)


def test_a_what_if_decides_by_the_simulated_wait_not_the_counts() -> None:
    rule = LateBinding(max_queueing_s=0.2)
    assert rule.would_start(_view(running=4, queueing_s=0.15), 64, CONFIG)
    assert not rule.would_start(_view(queueing_s=0.25), 64, CONFIG)


@pytest.mark.parametrize("kwargs", [{"max_queueing_s": -0.1}, {"kv_reserve": 1.0}])
def test_nonsense_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        LateBinding(**kwargs)


def _heavy_tailed(n: int, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    lengths = [(rng.randint(16, 300), min(int(rng.paretovariate(1.2) * 20), 200))
               for _ in range(n)]
    return Workload("test", poisson_unit_arrivals(n, seed), tuple(p for p, _ in lengths),
                    tuple(d for _, d in lengths))


@pytest.mark.parametrize("policy", ["least_requests", "block"])
def test_at_low_load_nothing_is_held_and_the_run_is_unchanged(
        policy: str, toy_model) -> None:  # type: ignore[no-untyped-def]
    setup = ClusterSetup(3, CONFIG, toy_model, exec_noise_sigma=0.1)
    workload = _heavy_tailed(120)
    plain = simulate(workload, 0.5, setup, policy, OraclePredictor(), keep_samples=True)
    held = simulate(workload, 0.5, setup, policy, OraclePredictor(), keep_samples=True,
                    late_binding=LateBinding(max_queueing_s=0.05, kv_reserve=0.0))
    assert (held.ttft_s, held.e2e_s) == (plain.ttft_s, plain.e2e_s)


@pytest.mark.parametrize("policy", ["least_requests", "block"])
def test_under_overload_every_held_request_runs_once(
        policy: str, toy_model) -> None:  # type: ignore[no-untyped-def]
    setup = ClusterSetup(3, CONFIG, toy_model, exec_noise_sigma=0.1, abort_ttft_s=None)
    workload = _heavy_tailed(400, seed=1)
    held = simulate(workload, 30.0, setup, policy, OraclePredictor(), keep_samples=True,
                    late_binding=LateBinding(max_queueing_s=0.0, kv_reserve=0.0))
    assert held.num_requests == 400 == len(held.ttft_s)
    assert all(0 < t <= e for t, e in zip(held.ttft_s, held.e2e_s, strict=True))


@pytest.mark.parametrize("seed", [1, 2])
def test_near_capacity_one_queue_at_the_router_cuts_a_load_balancers_wait_tail(
        seed: int, toy_model) -> None:  # type: ignore[no-untyped-def]
    """A request bound at arrival waits behind a long one while another instance frees;
    held at the router it takes the first free seat (M/G/c against c x M/G/1). With states
    published every 20 ms an idle seat waits little for the router to see it."""
    setup = ClusterSetup(3, CONFIG, toy_model, exec_noise_sigma=0.1, abort_ttft_s=None,
                         publish_interval_s=0.02)
    workload = _heavy_tailed(400, seed=seed)
    plain = simulate(workload, 20.0, setup, "least_requests", OraclePredictor())
    held = simulate(workload, 20.0, setup, "least_requests", OraclePredictor(),
                    late_binding=LateBinding(max_queueing_s=0.02, kv_reserve=0.0))
    assert held.ttft_p99_s < 0.9 * plain.ttft_p99_s


def _stuck_long_prompt() -> Workload:
    """One long request on each instance (KV for 400 prompt tokens, growing to 500); then a
    prompt that needs more blocks than either has left beside it; then four short requests
    that fit."""
    arrivals = (0.0, 0.001, 0.01, 0.02, 0.021, 0.022, 0.023)
    prompts = (400, 400, 510, 16, 16, 16, 16)
    outputs = (100, 100, 2, 5, 5, 5, 5)
    return Workload("stuck", arrivals, prompts, outputs)


#: 60 blocks of 16 tokens; a 400-token prompt is prefilled in one step.
TIGHT = InstanceConfig(num_total_blocks=60, block_size=16, max_num_seqs=4,
                       max_num_batched_tokens=512, max_model_len=512)


@pytest.mark.parametrize("overtake_s", [0.0, 5.0])
def test_short_requests_pass_a_stuck_long_prompt_only_when_overtaking_is_allowed(
        overtake_s: float, toy_model) -> None:  # type: ignore[no-untyped-def]
    setup = ClusterSetup(2, TIGHT, toy_model, exec_noise_sigma=0.0, abort_ttft_s=None)
    # 10 % of 60 blocks kept: 29 spare beside a long request, the 510-token prompt needs 32.
    rule = LateBinding(max_queueing_s=0.0, kv_reserve=0.1, overtake_s=overtake_s)
    result = simulate(_stuck_long_prompt(), 1.0, setup, "least_requests", OraclePredictor(),
                      keep_samples=True, late_binding=rule)
    assert result.num_requests == 7
    long_done = min(result.e2e_s[:2])
    shorts_ttft = result.ttft_s[3:]
    if overtake_s:
        assert max(shorts_ttft) < 0.2 < long_done
    else:
        # In strict arrival order they wait behind the held prompt, which waits for a long one.
        assert min(shorts_ttft) > long_done - 0.1
