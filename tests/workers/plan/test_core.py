"""The fleet planner's pure core (workers/plan): inputs, datasheet kinds, the search."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from workers.cluster_sim import poisson_unit_arrivals
from workers.cluster_sim.fleet_setup import fleet_members
from workers.plan import (
    PlanInputError,
    PlanOptions,
    PlanRequest,
    Targets,
    derivation_error,
    derived_models,
    fleet_entries,
    kind_model,
    load_catalog,
    lone_latency,
    parse_catalog,
    parse_workload,
    plan_fleet,
    replay_fleet,
    workload_of,
)
from workers.plan.baseline import routing_blind_mix
from workers.plan.replay import less_one_gpu
from workers.plan.search import PoolJudge, lengthened
from workers.serve.emulated_engine import EmulatedEngine, EmulatedEngineConfig
from workers.sim import BatchStats
from workers.sim.fleet_declaration import parse_fleet

#: Quick searches for tests: short runs, few saturated requests.
FAST = PlanOptions(min_requests_per_instance=20, min_requests_per_pool=0, saturation_requests=100,
                   headroom_resolution=0.2)


def _line(**fields: object) -> str:
    row = {"arrival_s": 0.5, "model": "llama-2-7b", "prompt_tokens": 100, "output_tokens": 50}
    row.update(fields)
    return json.dumps({k: v for k, v in row.items() if v is not None})


def _requests(model: str, num: int, rate: float, prompt: int, output: int,
              seed: int = 0) -> list[PlanRequest]:
    arrivals = poisson_unit_arrivals(num, seed)
    return [PlanRequest(arrival_s=t / rate, model=model, prompt_tokens=prompt + (i * 37) % prompt,
                        output_tokens=output + (i * 53) % output)
            for i, t in enumerate(arrivals)]


# -- workload ---------------------------------------------------------------------------------

def test_workload_groups_models_and_keeps_each_rate() -> None:
    lines = [_line(arrival_s=t, model=m) for t, m in
             ((0, "a"), (1, "b"), (2, "a"), (3, "a"), (4, "b"))]
    workload = parse_workload(lines)
    assert workload.models == ["a", "b"]
    assert workload.rate_by_model["a"] == pytest.approx(3 / 4)
    assert workload.rate_by_model["b"] == pytest.approx(2 / 4)
    # At its own rate a model's requests arrive when the file says.
    assert workload.by_model["a"].arrival_times(0.75) == pytest.approx([0, 2, 3])


@pytest.mark.parametrize("line,expected", [
    (_line(model=None), "line 2: model: missing"),
    (_line(prompt_tokens=-5), "line 2: prompt_tokens"),
    (_line(output_tokens=0), "line 2: output_tokens"),
    ("{not json", "line 2: not JSON"),
    ("[1, 2]", "line 2: expected an object"),
])
def test_a_bad_workload_line_is_named(line: str, expected: str) -> None:
    with pytest.raises(PlanInputError, match=expected):
        parse_workload([_line(), line, _line()])


def test_an_empty_workload_is_refused() -> None:
    with pytest.raises(PlanInputError, match="no requests"):
        parse_workload(["", "  "])


# -- catalog ----------------------------------------------------------------------------------

def test_the_default_catalog_prices_every_kind_with_its_source() -> None:
    catalog = load_catalog()
    names = [k.name for k in catalog.kinds]
    assert {"L4", "A10G", "L40S", "A30", "A100-80GB", "H100-80GB"} <= set(names)
    for kind in catalog.kinds:
        assert kind.price_per_hour > 0 and kind.price_source and kind.price_date


@pytest.mark.parametrize("missing", ["price_per_hour", "bandwidth_gb_s", "memory_gib",
                                     "bf16_tflops"])
def test_a_catalog_kind_without_a_figure_is_named(missing: str) -> None:
    kind = {"name": "B200", "memory_gib": 180, "bandwidth_gb_s": 8000, "bf16_tflops": 2250,
            "price_per_hour": 9.0}
    del kind[missing]
    with pytest.raises(PlanInputError, match=f"GPU kind 'B200': {missing}: missing"):
        parse_catalog(json.dumps({"kinds": [kind]}))


def test_a_catalog_kind_listed_twice_is_refused() -> None:
    kind = {"name": "L4", "memory_gib": 24, "bandwidth_gb_s": 300, "bf16_tflops": 121,
            "price_per_hour": 0.8}
    with pytest.raises(PlanInputError, match="'L4' is listed twice"):
        parse_catalog(json.dumps({"kinds": [kind, kind]}))


# -- a kind from its datasheet ----------------------------------------------------------------

@pytest.mark.parametrize("target", ["a100", "h100"])
def test_derived_step_times_match_the_profiled_kinds(target: str) -> None:
    # Llama-2-7B derived from the A30 by datasheet ratios, against its A100 / H100 profile.
    assert derivation_error("llama-2-7b", "a30", target)["median"] <= 0.10


def test_a_profiled_kind_runs_its_bundled_model_and_others_are_derived() -> None:
    catalog = load_catalog()
    a100 = kind_model("llama-2-7b", catalog.kind("A100-80GB"))
    assert (a100.exec_model_name, a100.derived) == ("llama-2-7b-a100", False)
    l4 = kind_model("llama-2-7b", catalog.kind("L4"))
    assert (l4.exec_model_name, l4.derived) == ("llama-2-7b-l4", True)
    # 24 GiB holds as many Llama-2-7B blocks as the A30 (the Block paper's 1,052).
    assert l4.config.num_total_blocks == 1052
    a30 = kind_model("llama-2-7b", catalog.kind("A30"))
    # A third of the A30's bandwidth: decode is slower on the L4; prefill compute is close.
    assert lone_latency(l4, 100, 200)[1] > 2.5 * lone_latency(a30, 100, 200)[1]


def test_a_family_without_a_profile_is_named() -> None:
    with pytest.raises(PlanInputError, match="model 'mistral-7b' has no execution-time model"):
        kind_model("mistral-7b", load_catalog().kind("L4"))


# -- search -----------------------------------------------------------------------------------

def _small_plan_inputs() -> tuple:
    requests = (_requests("llama-2-7b", 300, 4.0, 200, 150)
                + _requests("llama-3-8b", 150, 2.0, 1500, 20, seed=1))
    catalog = load_catalog().only(["A30", "L40S", "A100-80GB"])
    targets = {"llama-2-7b": Targets(ttft_p99_s=1.0), "llama-3-8b": Targets(e2e_p99_s=6.0)}
    return workload_of(requests), catalog, targets


def test_the_plan_meets_every_target_is_tight_and_beats_or_ties_each_single_kind() -> None:
    workload, catalog, targets = _small_plan_inputs()
    plan = plan_fleet(workload, targets, catalog, FAST)
    assert set(plan.pools) == {"llama-2-7b", "llama-3-8b"}
    assert all(pool.meets for pool in plan.pools.values())
    for alternative in plan.alternatives:
        if alternative.name.startswith("single:") and alternative.meets_targets:
            assert plan.cost_per_hour <= alternative.cost_per_hour + 1e-9
    assert plan.headroom >= 1.0
    prices = {k.name: k.price_per_hour for k in catalog.kinds}
    for model, pool in plan.pools.items():
        judge = PoolJudge(model, workload.by_model[model], workload.rate_by_model[model],
                          targets[model], {k: plan.kind_models[(model, k)] for k in prices},
                          prices, {}, FAST)
        for kind, _count in pool.mix:  # less any one GPU: a target is missed
            fewer = tuple((k, n - (k == kind)) for k, n in pool.mix)
            assert not judge.judge(fewer).meets


def test_worker_processes_and_runs_ahead_change_no_plan() -> None:
    """Two worker processes search the pools and kinds at once and run ahead of need: the
    plan, its figures and the count of simulations it used are those of one process."""
    workload, catalog, targets = _small_plan_inputs()
    alone = plan_fleet(workload, targets, catalog, FAST)
    spread = plan_fleet(workload, targets, catalog, FAST, jobs=2)
    assert spread.pools == alone.pools
    assert spread.alternatives == alone.alternatives
    assert spread.headroom_by_model == alone.headroom_by_model
    assert spread.num_simulations == alone.num_simulations
    # Where no fleet meets a target, the same closest figure: runs made ahead are not tried.
    targets["llama-3-8b"] = Targets(e2e_p99_s=0.05)
    messages = []
    for jobs in (1, 2):
        with pytest.raises(PlanInputError) as unmeetable:
            plan_fleet(workload, targets, catalog, FAST, jobs=jobs)
        messages.append(str(unmeetable.value))
    assert messages[0] == messages[1]


def test_a_model_without_a_target_is_named() -> None:
    workload, catalog, targets = _small_plan_inputs()
    with pytest.raises(PlanInputError, match="model 'llama-3-8b' has no target"):
        plan_fleet(workload, {"llama-2-7b": targets["llama-2-7b"]}, catalog, FAST)


def test_an_unmeetable_target_says_the_best_figure_and_fleet() -> None:
    workload, catalog, targets = _small_plan_inputs()
    targets["llama-3-8b"] = Targets(e2e_p99_s=0.05)  # under a lone 1,500-token prefill
    with pytest.raises(PlanInputError, match=r"model 'llama-3-8b': no fleet of the catalog "
                       r"meets e2e_p99<=0.05s; even alone on an idle (\S+) .* p99 is"):
        plan_fleet(workload, targets, catalog, FAST)


def test_the_routing_blind_program_covers_the_rate() -> None:
    workload, catalog, targets = _small_plan_inputs()
    model = "llama-2-7b"
    kinds = {k.name: kind_model(model, k) for k in catalog.kinds}
    chat = workload.by_model[model]
    serves = {k: [True] * len(chat) for k in kinds}
    mix = routing_blind_mix(chat, workload.rate_by_model[model], kinds,
                            {k.name: k.price_per_hour for k in catalog.kinds},
                            {k.name: None for k in catalog.kinds}, serves)
    assert mix and all(count > 0 for count in mix.values())


def test_a_short_workload_is_lengthened_at_the_same_rate() -> None:
    workload, _, _ = _small_plan_inputs()
    chat = workload.by_model["llama-2-7b"]
    longer = lengthened(chat, 1000)
    assert len(longer) == 1200
    assert longer.num_prompt_tokens[:300] == chat.num_prompt_tokens
    span = longer.unit_arrival_s[-1] - longer.unit_arrival_s[0]
    assert (len(longer) - 1) / span == pytest.approx(1.0)


def test_a_pools_run_replays_at_least_the_pools_floor_of_requests() -> None:
    """A p99 of a few hundred requests is chance, so a small workload is judged repeated."""
    workload, catalog, _ = _small_plan_inputs()
    specs = parse_fleet(json.dumps([{"model": m, "count": 2, "gpu_kind": "A30"}
                                    for m in workload.models]))
    as_given = replay_fleet(specs, workload, catalog, FAST)["models"]
    floored = replay_fleet(specs, workload, catalog,
                           dataclasses.replace(FAST, min_requests_per_pool=700))["models"]
    for model in workload.models:
        assert as_given[model]["requests"] == len(workload.by_model[model]) < 700
        assert floored[model]["requests"] >= 700


def test_a_replayed_plan_shows_the_figures_the_planner_predicted() -> None:
    workload, catalog, targets = _small_plan_inputs()
    plan = plan_fleet(workload, targets, catalog, FAST)
    specs = parse_fleet(json.dumps(fleet_entries(plan)))
    replayed = replay_fleet(specs, workload, catalog, FAST)["models"]
    for model, pool in plan.pools.items():
        assert replayed[model]["ttft_p99_s"] == pytest.approx(pool.ttft_p99_s, abs=1e-4)
        assert replayed[model]["e2e_p99_s"] == pytest.approx(pool.e2e_p99_s, abs=1e-4)
        assert replayed[model]["requests"] == pool.num_requests


def test_a_fleet_of_derived_kinds_runs_their_derived_step_times(tmp_path: Path) -> None:
    """`--fleet-out`'s entries for kinds profiled nowhere name their derived models' files:
    the fleet declaration accepts them, and the simulator and the emulated engine price steps
    with the planner's models, KV blocks and batch sizes (not the configured default)."""
    workload, catalog, targets = _small_plan_inputs()
    plan = plan_fleet(workload, targets, catalog.only(["L40S"]), FAST)
    models = derived_models(plan)
    assert models and all(name.endswith(".json") for name in models)
    for name, model in models.items():
        model.save(tmp_path / name)
    specs = parse_fleet(json.dumps(fleet_entries(plan, tmp_path)))
    assert len(specs) == sum(pool.num_instances for pool in plan.pools.values())
    step = BatchStats(num_decode_seqs=8, decode_context_tokens=4000)
    for spec, member in zip(specs, fleet_members(specs), strict=True):
        planned = plan.kind_models[(spec.model, "L40S")]
        assert spec.exec_model == str(tmp_path / f"{planned.exec_model_name}.json")
        assert member.exec_model.step_ms(step) == pytest.approx(planned.exec_model.step_ms(step))
        assert (member.config.num_total_blocks, member.config.max_num_seqs) == (
            planned.config.num_total_blocks, planned.config.max_num_seqs)
        engine = EmulatedEngine(EmulatedEngineConfig(exec_model=spec.exec_model))
        assert engine.exec_model.step_ms(step) == pytest.approx(planned.exec_model.step_ms(step))
    with pytest.raises(ValueError, match="is a model file: give num_blocks and max_num_seqs"):
        parse_fleet(json.dumps([{"model": "m", "exec_model": specs[0].exec_model}]))
    with pytest.raises(ValueError, match="neither a bundled one .* nor a model file"):
        parse_fleet(json.dumps([{"model": "m", "exec_model": str(tmp_path / "gone.json")}]))


def test_a_replay_names_a_model_the_fleet_does_not_serve() -> None:
    workload, catalog, _ = _small_plan_inputs()
    specs = parse_fleet(json.dumps([{"model": "llama-2-7b", "gpu_kind": "A30"}]))
    with pytest.raises(PlanInputError, match="model 'llama-3-8b' of the workload has no "
                       "instance in the fleet"):
        replay_fleet(specs, workload, catalog, FAST)


def test_each_fleet_one_gpu_smaller_is_listed() -> None:
    entries = [{"model": "a", "count": 2, "gpu_kind": "L4"},
               {"model": "a", "count": 1, "gpu_kind": "H100-80GB"}]
    fleets = dict(less_one_gpu(entries))
    assert fleets["a: 1 x L4"] == [{"model": "a", "count": 1, "gpu_kind": "L4"}, entries[1]]
    assert fleets["a: 0 x H100-80GB"] == [entries[0]]


def test_a_bucket_no_kind_serves_alone_still_gets_a_kind() -> None:
    workload, catalog, _ = _small_plan_inputs()
    model = "llama-3-8b"
    kinds = {k.name: kind_model(model, k) for k in catalog.kinds}
    bulk = workload.by_model[model]
    serves = {k: [False] * len(bulk) for k in kinds}  # a target no lone request meets
    mix = routing_blind_mix(bulk, workload.rate_by_model[model], kinds,
                            {k.name: k.price_per_hour for k in catalog.kinds},
                            {k.name: None for k in catalog.kinds}, serves)
    assert mix and sum(mix.values()) >= 1


class _ScaleJudge(PoolJudge):
    """A judge whose pools meet their targets up to a fixed rate scale (no simulation)."""

    def __init__(self, limit: float, options: PlanOptions) -> None:  # noqa: D107
        self.limit, self.options, self.tried = limit, options, []

    def judge(self, mix, scale=1.0):  # type: ignore[no-untyped-def, override]
        self.tried.append(round(scale, 6))
        return type("Verdict", (), {"meets": scale <= self.limit})()

    def prefetch(self, *candidates):  # type: ignore[no-untyped-def, override]
        """Runs ahead of need change no verdict (none here)."""


@pytest.mark.parametrize(("limit", "tried", "headroom"), [
    (1.07, [1.1, 1.05], 1.1),  # 1.1 - 1.05 is 0.05 to the resolution: no third run
    (1.3, [1.1, 1.25, 1.5, 1.375, 1.3125, 1.28125], 1.312),
    (0.5, [1.1, 1.05], 1.05),
])
def test_headroom_is_bisected_to_its_resolution_and_no_further(
        limit: float, tried: list[float], headroom: float) -> None:
    judge = _ScaleJudge(limit, PlanOptions(headroom_resolution=0.05))
    assert judge.headroom((("L4", 1),)) == headroom
    assert judge.tried == tried
