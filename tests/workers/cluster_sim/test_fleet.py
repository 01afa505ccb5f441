"""A fleet of unlike instances in the cluster simulation: declared as BLOCKQ_FLEET JSON, each
instance on its own hardware, every what-if on its instance's own execution-time model."""

from __future__ import annotations

import random

import pytest

from workers.cluster_sim import (
    ClusterSetup,
    FleetMember,
    OraclePredictor,
    Workload,
    declared_fleet,
    fleet_label,
    fleet_members,
    poisson_unit_arrivals,
    simulate,
    with_equal_kv,
    with_throughputs,
)
from workers.sim import ExecModel, InstanceConfig
from workers.sim.fleet_declaration import parse_fleet

FLEET = ('[{"model": "llama-2-7b", "count": 2, "exec_model": "llama-2-7b-a100"},'
         ' {"model": "llama-2-7b-a30", "count": 3}]')


def _workload(n: int, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    lengths = [(rng.randint(8, 200), rng.randint(1, 120)) for _ in range(n)]
    return Workload("test", poisson_unit_arrivals(n, seed), tuple(p for p, _ in lengths),
                    tuple(d for _, d in lengths))


def test_a_declared_fleet_gives_each_instance_its_gpus_settings_and_step_times() -> None:
    specs = parse_fleet(FLEET)
    members = fleet_members(specs, max_model_len=2048)
    assert fleet_label(specs) == "2xllama-2-7b-a100+3xllama-2-7b-a30"
    assert [m.exec_model.name for m in members] == ["llama-2-7b-a100"] * 2 + ["llama-2-7b-a30"] * 3
    assert [m.config.num_total_blocks for m in members] == [7503] * 2 + [1052] * 3
    assert {m.config.max_model_len for m in members} == {2048}
    equal = with_equal_kv(members)
    assert {m.config for m in equal} == {members[-1].config}
    assert [m.exec_model.name for m in equal] == [m.exec_model.name for m in members]


def test_an_instance_without_an_execution_time_model_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'mystery' names no exec_model"):
        fleet_members(parse_fleet('[{"model": "mystery"}]'))


def test_throughputs_are_measured_once_per_kind_and_rank_the_gpus() -> None:
    members = with_throughputs(fleet_members(parse_fleet(FLEET)), _workload(200))
    fast, slow = members[0].throughput_rps, members[-1].throughput_rps
    assert fast is not None and slow is not None and fast > 2 * slow
    assert len({m.throughput_rps for m in members}) == 2


def _two_speed_setup(toy_model: ExecModel, config: InstanceConfig) -> ClusterSetup:
    fast = ExecModel("fast", toy_model.token_knots,
                     {k: v / 3 for k, v in toy_model.coefficients_ms.items()})
    return ClusterSetup.of_fleet([FleetMember(config, fast, throughput_rps=3.0),
                                  FleetMember(config, toy_model, throughput_rps=1.0)],
                                 exec_noise_sigma=0.0, publish_interval_s=0.0)


@pytest.mark.parametrize("policy", ["block_ttft", "capacity_weighted"])
def test_routing_that_knows_the_speeds_beats_counting_requests(
        toy_model, small_config, policy: str) -> None:  # type: ignore[no-untyped-def]
    setup = _two_speed_setup(toy_model, small_config)
    workload = _workload(300)
    aware = simulate(workload, 14.0, setup, policy, OraclePredictor())
    blind = simulate(workload, 14.0, setup, "least_requests", OraclePredictor())
    assert aware.e2e_p50_s < blind.e2e_p50_s
    assert aware.ttft_p99_s <= blind.ttft_p99_s


def test_a_fleet_must_match_its_size() -> None:
    with pytest.raises(ValueError, match="fleet's size"):
        ClusterSetup(3, InstanceConfig(200, 16, 8, 64, 512), ExecModel("m", (), {"const": 1.0}),
                     fleet=(FleetMember(InstanceConfig(200, 16, 8, 64, 512),
                                        ExecModel("m", (), {"const": 1.0})),))


def test_a_live_fleet_is_declared_as_the_simulation_runs_it() -> None:
    """What a live stack is told per instance (KV blocks, seats, capacity) is what the
    simulation runs; an entry's own sizes and capacity win."""
    specs = parse_fleet(FLEET)
    workload = _workload(60)
    declared = declared_fleet(specs, workload, max_model_len=2048)
    members = with_throughputs(fleet_members(specs, max_model_len=2048), workload)
    assert [(d.num_blocks, d.max_num_seqs) for d in declared] == [
        (m.config.num_total_blocks, m.config.max_num_seqs) for m in members]
    assert [d.capacity_rps for d in declared] == pytest.approx(
        [m.throughput_rps for m in members], rel=1e-3)
    assert fleet_members(declared, max_model_len=2048) == fleet_members(specs, max_model_len=2048)
    own = parse_fleet('[{"model": "llama-2-7b-a30", "num_blocks": 256, "max_num_seqs": 4, '
                      '"capacity_rps": 1.5}]')
    (small,) = declared_fleet(own, workload, max_model_len=2048)
    assert (small.num_blocks, small.max_num_seqs, small.capacity_rps) == (256, 4, 1.5)
