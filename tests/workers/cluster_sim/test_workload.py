"""Workloads: trace loading, fitting to the model's context, rescaling to a rate."""

from __future__ import annotations

import statistics

import pytest

from workers.cluster_sim.workload import (
    Workload,
    fit_to_model,
    load_azure_trace,
    load_length_trace,
    poisson_unit_arrivals,
)


def test_fit_to_model_drops_prompts_vllm_rejects_and_caps_outputs() -> None:
    prompts, outputs = fit_to_model([100, 4096, 4000, 10], [50, 10, 500, 0], max_model_len=4096)
    assert prompts == [100, 4000, 10] and outputs == [50, 96, 1]


def test_poisson_arrivals_have_unit_rate_and_rescale() -> None:
    times = poisson_unit_arrivals(20_000, seed=3)
    assert times[0] == 0.0 and times == poisson_unit_arrivals(20_000, seed=3)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(1, rel=0.03)
    workload = Workload("w", times[:3], (1, 2, 3), (4, 5, 6))
    assert workload.arrival_times(4.0) == [t / 4 for t in times[:3]]


def test_length_trace_loads_in_file_order(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "lengths.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
                    "10,5,15,2\n5000,5,5005,1000\n30,7,37,4.3\n40,9,49,4.4\n")
    workload = load_length_trace(path, max_model_len=4096, num_requests=2, seed=0)
    assert workload.num_prompt_tokens == (10, 30) and workload.num_output_tokens == (5, 7)
    assert workload.name == "lengths" and len(workload) == 2


def test_azure_trace_keeps_its_arrival_pattern_at_unit_rate(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 23:59:59.0000000,100,10\n"
                    "2023-11-17 00:00:00.5000000,200,20\n"
                    "2023-11-17 00:00:01.0000000,9000,30\n"
                    "2023-11-17 00:00:09.0000000,300,4000\n")
    workload = load_azure_trace(path, max_model_len=4096)
    assert workload.num_prompt_tokens == (100, 200, 300)
    assert workload.num_output_tokens == (10, 20, 3796)
    # 10 s for two gaps: scaled so the mean gap is 1 s; a burst stays a burst.
    assert workload.unit_arrival_s == pytest.approx((0.0, 0.3, 2.0))
    assert workload.head(2).unit_arrival_s == (0.0, 1.0)


def test_workload_rejects_inconsistent_input() -> None:
    with pytest.raises(ValueError, match="as many"):
        Workload("w", (0.0, 1.0), (1,), (1,))
    with pytest.raises(ValueError, match="ascending"):
        Workload("w", (1.0, 0.0), (1, 1), (1, 1))
    with pytest.raises(ValueError, match="rate"):
        Workload("w", (0.0,), (1,), (1,)).arrival_times(0)
