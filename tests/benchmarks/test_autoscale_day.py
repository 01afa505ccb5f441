"""The autoscaling benchmark's day: the diurnal curve and office windows, a trace that keeps the
Azure hour's burstiness on the day's shape, the static fleet sized for the peak by the same
decision, and the figures a run gives."""

from __future__ import annotations

import math

import pytest

from benchmarks.autoscale_day import (
    TROUGH,
    Outcome,
    Sample,
    day_trace,
    diurnal,
    figures,
    gpu_hours,
    office,
    peak_counts,
)
from workers.autoscale.decide import AutoscalePolicy, EntryState, SaturationSizer
from workers.cluster_sim import Workload


def _unit(n: int, prompt: int = 300, output: int = 100) -> Workload:
    return Workload("unit", tuple(float(i) for i in range(n)), (prompt,) * n, (output,) * n)


def test_the_curve_peaks_at_fifteen_and_troughs_at_three_five_to_one_at_least() -> None:
    assert diurnal(15.0) == pytest.approx(1.0) and diurnal(3.0) == pytest.approx(TROUGH)
    hours = [h / 10 for h in range(240)]
    assert max(map(diurnal, hours)) / min(map(diurnal, hours)) >= 5
    assert office(10.0) == 1 and office(12.0) == 0 and office(15.0) == 1 and office(20.0) == 0


def test_the_day_follows_the_curve_and_the_code_model_sleeps_between_windows() -> None:
    trace = day_trace(_unit(500), _unit(500), day_s=2400, chat_peak_rps=2.0, code_rps=1.0)
    assert [r.at_s for r in trace] == sorted(r.at_s for r in trace)
    per_hour = [0] * 24
    code_hours = set()
    for r in trace:
        hour = int(r.at_s * 24 / 2400)
        if r.model == "chat":
            per_hour[hour] += 1
        else:
            code_hours.add(hour)
    # The expected chat arrivals of each hour: 2 req/s x 100 s x the curve (the unit trace is
    # regular here), cycled past its 500 arrivals.
    for hour, count in enumerate(per_hour):
        expected = 2.0 * 100 * sum(diurnal(hour + (k + 0.5) / 100) for k in range(100)) / 100
        assert abs(count - expected) <= 2, (hour, count, expected)
    assert code_hours == {9, 10, 11, 14, 15, 16}


def test_the_static_fleet_is_the_decision_at_the_peak() -> None:
    trace = day_trace(_unit(2000, 400, 150), _unit(10), day_s=2400, chat_peak_rps=4.0,
                      code_rps=0.0)
    entries = [EntryState(0, "chat", "A30", "llama-2-7b-a30", 1, 8, 0, 1.0),
               EntryState(1, "chat", "H100", "llama-2-7b-h100", 0, 2, 0, 6.9)]
    policy = AutoscalePolicy(window_s=300, recent_s=60, horizon_s=0)
    counts = peak_counts(trace, entries, SaturationSizer(), policy)
    sizer = SaturationSizer()
    from workers.autoscale.decide import Arrival  # noqa: PLC0415

    sample = [Arrival(float(i), 400, 150) for i in range(100)]
    capacity = sizer.capacity_rps(entries[0], sample)
    # Enough A30s for the peak minute's rate x the headroom, none more than one too many.
    peak_rate = 4.0
    assert counts[0] * capacity >= peak_rate * policy.headroom * 0.8
    assert (counts[0] - 1) * capacity < peak_rate * policy.headroom * 1.3
    assert counts[1] == 0  # the cheaper kind had room


def test_figures_leave_out_arrivals_at_zero_and_count_what_went_wrong() -> None:
    outcomes = [Outcome("chat", False, "succeeded", 0.5, 1, 1),
                Outcome("chat", False, "succeeded", 3.0, 1, 1),  # over the 2 s target
                Outcome("chat", True, "succeeded", 65.0, 1, 1),  # at zero: apart
                Outcome("chat", False, "succeeded", 0.4, 2, 1),  # done twice
                Outcome("chat", False, "succeeded", 0.4, 1, 0),  # no webhook
                Outcome("chat", False, "missing", None, 0, 0)]  # lost
    samples = [Sample(0.0, {"A30": 1}), Sample(1800.0, {"A30": 2, "H100": 1})]
    result = figures("x", outcomes, samples, {"A30": 1.0, "H100": 7.0}, {"chat": 2.0},
                     3600.0, num_scale_downs=3)
    assert (result.num_measured, result.num_within_target, result.num_at_zero) == (5, 3, 1)
    assert result.at_zero_ttft_s == [65.0]
    assert (result.num_lost, result.num_twice, result.num_missing_webhooks) == (1, 1, 1)
    assert result.gpu_hours_weighted == pytest.approx(0.5 * 1 + 0.5 * 9)
    assert gpu_hours([], {}, 10.0) == 0 and math.isclose(result.share_within_target, 0.6)


def test_the_dry_run_wakes_a_sleeping_model_and_puts_it_back_to_sleep() -> None:
    from benchmarks.autoscale_day import DayRequest, replay_decisions  # noqa: PLC0415

    burst = [DayRequest(100.0 + i * 0.5, "code", 300, 80) for i in range(200)]  # 100-200 s
    entries = [EntryState(0, "code", "A100", "llama-3-8b-a100", 0, 2, 0, 5.0)]
    policy = AutoscalePolicy(window_s=60, recent_s=20, bucket_s=5, horizon_s=10,
                             scale_down_after_s=30)
    samples, downs = replay_decisions(burst, entries, SaturationSizer(), policy,
                                      interval_s=10, day_s=400)
    counts = [s.running.get("A100", 0) for s in samples]
    assert counts[0] == 0 and max(counts) >= 1 and counts[-1] == 0
    assert downs >= 1 and all(0 <= n <= 2 for n in counts)
