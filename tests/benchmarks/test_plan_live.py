"""The live proof of a plan's pure parts: the plan's fleet as emulated entries (derived kinds
refused), the workload file as the live requests, and the comparison rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.plan_live import (
    PlanLiveError,
    compare_rows,
    instance_shares,
    plan_fleet_specs,
    plan_requests,
    plan_workload,
)

_ENTRY = {"model": "llama-2-7b", "count": 2, "gpu_kind": "A30", "exec_model": "llama-2-7b-a30",
          "derived": False, "price_per_hour": 1.0, "num_blocks": 1052, "max_num_seqs": 48,
          "capacity_rps": 3.5}


def test_fleet_entries_keep_the_planned_sizes() -> None:
    specs = plan_fleet_specs({"fleet": [_ENTRY]}, model_path=Path("tok"))
    (spec,) = specs
    assert (spec.count, spec.exec_model, spec.num_blocks, spec.max_num_seqs,
            spec.capacity_rps, spec.engine) == (2, "llama-2-7b-a30", 1052, 48, 3.5, "emulated")


def test_a_derived_kind_is_refused_by_name() -> None:
    derived = _ENTRY | {"gpu_kind": "L40S", "exec_model": "llama-2-7b-l40s", "derived": True}
    with pytest.raises(PlanLiveError, match="L40S"):
        plan_fleet_specs({"fleet": [_ENTRY, derived]}, model_path=Path("tok"))


def test_an_unsized_entry_is_refused() -> None:
    with pytest.raises(PlanLiveError, match="num_blocks"):
        plan_fleet_specs({"fleet": [_ENTRY | {"num_blocks": None}]}, model_path=Path("tok"))


def _lines(*rows: dict) -> list[str]:
    return [json.dumps(r) for r in rows]


def test_a_bad_workload_line_is_named() -> None:
    with pytest.raises(PlanLiveError, match="line 2"):
        plan_requests(_lines({"arrival_s": 0, "model": "a", "prompt_tokens": 5,
                              "output_tokens": 3},
                             {"arrival_s": 1, "prompt_tokens": 5, "output_tokens": 3}))


def test_workload_keeps_arrivals_models_and_true_lengths() -> None:
    requests = plan_requests(_lines(
        {"arrival_s": 10.5, "model": "b", "prompt_tokens": 4, "output_tokens": 90},
        {"arrival_s": 10.0, "model": "a", "prompt_tokens": 3, "output_tokens": 7},
        {"arrival_s": 12.0, "model": "a", "prompt_tokens": 5, "output_tokens": 9}))
    drawn: list[list[int]] = []

    def learned(true: list[int]) -> list[int]:
        drawn.append(true)
        return [2 * n for n in true]

    workload = plan_workload(requests, max_model_len=64, seed=0, decode=str, vocab_size=100,
                             learned=learned)
    assert workload.unit_arrival_s == [0.0, 0.5, 2.0]
    assert [r.model for r in workload.requests] == ["a", "b", "a"]
    assert [r.prompt_tokens for r in workload.requests] == [3, 4, 5]
    assert [len(r.prompt) for r in workload.requests] == [3, 4, 5]
    # the context caps the answer at 64 - 4 tokens, as the planner caps it
    assert [r.output_tokens for r in workload.requests] == [7, 60, 9]
    assert drawn == [[7, 9], [60]]  # one draw a model, in arrival order
    assert [r.learned_tokens for r in workload.requests] == [14, 120, 18]
    assert workload.table_rows("learned")[1]["predicted_tokens"] == 60  # capped at the room


def test_a_prompt_longer_than_the_context_is_refused() -> None:
    requests = plan_requests(_lines({"arrival_s": 0, "model": "a", "prompt_tokens": 64,
                                     "output_tokens": 3}))
    with pytest.raises(PlanLiveError, match="max_model_len 64"):
        plan_workload(requests, max_model_len=64, seed=0, decode=str, vocab_size=100,
                      learned=None)


def test_compare_rows_give_ratios_and_missing_figures() -> None:
    rows = compare_rows(
        {"a": {"ttft_p99_s": 0.5, "e2e_p99_s": 10.0}, "b": {"ttft_p99_s": 1.0, "e2e_p99_s": None}},
        {"a": {"requests": 3, "ttft_s": {"p99": 0.55}, "e2e_s": {"p99": 9.0},
               "accept_to_routed_s": {"p99": 0.02}}})
    assert rows[0]["accept_to_routed_p99_s"] == 0.02 and rows[1]["accept_to_routed_p99_s"] is None
    assert rows[0]["ttft_p99_s"]["ratio"] == pytest.approx(1.1)
    assert rows[0]["e2e_p99_s"]["ratio"] == pytest.approx(0.9)
    assert rows[1]["requests"] == 0 and rows[1]["ttft_p99_s"]["ratio"] is None
    assert rows[1]["e2e_p99_s"] == {"live": None, "predicted": None, "ratio": None}


def test_instance_shares_count_each_models_requests_per_instance() -> None:
    models = ["chat", "bulk", "chat", "chat", None]
    samples = [[0, 0.1, 1.0, 10, 5, 5, 5, "gpu.0"], [1, 0.1, 1.0, 10, 5, 5, 5, "gpu.2"],
               [2, 0.1, 1.0, 10, 5, 5, 5, "gpu.1"], [3, 0.1, 1.0, 10, 5, 5, 5, "gpu.0"],
               [4, 0.1, 1.0, 10, 5, 5, 5, "gpu.3"]]
    assert instance_shares(models, samples) == {"chat": {"gpu.0": 2, "gpu.1": 1},
                                                "bulk": {"gpu.2": 1}}


def test_the_default_label_leaves_the_routing_policy_unset(tmp_path: Path) -> None:
    from benchmarks.live.point import PointSpec, _settings

    requests = plan_requests(_lines({"arrival_s": 0, "model": "a", "prompt_tokens": 3,
                                     "output_tokens": 5}))
    workload = plan_workload(requests, max_model_len=64, seed=0, decode=str, vocab_size=100,
                             learned=lambda true: true)
    spec = PointSpec(workload, "default", 1.0, 4.0, 1, "postgresql+psycopg://x@127.0.0.1/x",
                     "redis://127.0.0.1:6379/0", tmp_path, 8000, 5000, 64, 10.0)
    settings = _settings(spec, tmp_path)
    assert "routing_policy" not in settings.model_fields_set
    assert settings.routing_policy_for(mixed_hardware=True) == settings.mixed_fleet_routing_policy
    assert settings.length_predictor == "table"
