"""Pure parts of the live benchmark (`benchmarks.live`): time conversion, percentiles with
requests that never finished, the capacity search."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.live import report, stats


def test_wall_times_and_rates_convert_to_emulated_ones() -> None:
    assert stats.emulated_s(12.0, 4.0) == 3.0  # 4 wall s per emulated s: slow motion
    assert stats.emulated_s(0.3, 0.1) == pytest.approx(3.0)
    assert stats.wall_rate(60.0, 4.0) == 15.0
    with pytest.raises(ValueError):
        stats.emulated_s(1.0, 0.0)


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1001])
def test_percentiles_match_numpy(n: int) -> None:
    values = list(np.random.default_rng(n).exponential(1.0, n))
    for q in (0, 50, 99, 100):
        assert stats.percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_a_request_that_never_finished_counts_as_infinitely_late() -> None:
    values = [1.0] * 99 + [math.inf]
    assert stats.percentile(values, 50) == 1.0
    assert math.isinf(stats.percentile(values, 99.5))
    assert math.isinf(stats.percentile([1.0, math.inf], 99))
    assert math.isnan(stats.percentile([], 50))
    summary = stats.summarize([4.0, 8.0, math.inf], time_scale=4.0)
    assert summary.p50 == 2.0 and math.isinf(summary.p99) and summary.count == 3


def _fake_measure(capacity: float):  # type: ignore[no-untyped-def]
    calls: list[float] = []

    def measure(rate: float) -> float:
        calls.append(rate)
        return 1.0 if rate <= capacity else 10.0

    return measure, calls


def test_the_capacity_search_stops_at_the_first_failure_then_bisects() -> None:
    measure, calls = _fake_measure(capacity=47.0)
    result = stats.search_capacity(measure, [60.0, 30.0, 40.0, 50.0, 70.0], slo=3.0,
                                      bisect_steps=2)
    assert calls == [30.0, 40.0, 50.0, 45.0, 47.5]  # ascending, 60 and 70 never run
    assert (result.capacity, result.first_failing) == (45.0, 47.5)
    assert result.tried[50.0] == 10.0


def test_the_capacity_search_when_all_pass_or_none_does() -> None:
    measure, calls = _fake_measure(capacity=100.0)
    result = stats.search_capacity(measure, [10.0, 20.0], slo=3.0, bisect_steps=3)
    assert (result.capacity, result.first_failing, calls) == (20.0, None, [10.0, 20.0])
    measure, calls = _fake_measure(capacity=5.0)
    result = stats.search_capacity(measure, [10.0, 20.0], slo=3.0, bisect_steps=3)
    assert (result.capacity, result.first_failing, calls) == (None, 10.0, [10.0])


def test_the_bisection_stops_at_the_resolution() -> None:
    measure, calls = _fake_measure(capacity=41.0)
    result = stats.search_capacity(measure, [40.0, 42.0], slo=3.0, bisect_steps=5,
                                      resolution=1.0)
    assert calls == [40.0, 42.0, 41.0] and result.capacity == 41.0


@pytest.mark.parametrize("total", [1, 2, 10, 100, 1000, 1001])
def test_a_percentile_is_certainly_above_once_enough_values_are(total: int) -> None:
    rng = np.random.default_rng(total)
    for num_above in range(total + 1):
        certain = stats.percentile_certainly_above(num_above, total, 99)
        # Worst case for "above": every other value sits just under the bound (1.0).
        values = [2.0] * num_above + list(rng.uniform(0.0, 1.0, total - num_above))
        if certain:
            assert stats.percentile(values, 99) > 1.0


def test_certainty_needs_the_values_at_and_above_the_lower_interpolation_point() -> None:
    # p99 of 1000 values interpolates between the 990th and 991st: 11 above make it certain,
    # 10 do not (the 990th may still be under the bound).
    assert stats.percentile_certainly_above(11, 1000, 99)
    assert not stats.percentile_certainly_above(10, 1000, 99)
    assert not stats.percentile_certainly_above(0, 0, 99)


def test_only_certainly_late_requests_count_as_late() -> None:
    progress = stats.RequestProgress
    rows = [
        progress("ended-on-time", True, 0.0, 2.0, False),
        progress("ended-late", True, 0.0, 4.0, False),
        progress("failed", True, 0.0, None, False),
        progress("waiting-in-engine-past-slo", False, 0.0, None, False),
        progress("waiting-in-engine-not-yet", False, 8.0, None, False),
        # Running with output in its state, or admitted after the states were read: unknown.
        progress("running-old", False, 0.0, None, False),
        progress("queued-before-engine", False, 1.0, None, True),
        progress("queued-recently", False, 9.0, None, True),
    ]
    waiting = {"waiting-in-engine-past-slo": 3.5, "waiting-in-engine-not-yet": 9.5}
    assert stats.count_done_and_late(rows, waiting, read_at=10.0, slo_s=3.0) == (3, 4)
    # An unbounded SLO: only the request that never got a first token is late.
    assert stats.count_done_and_late(rows, waiting, read_at=10.0, slo_s=math.inf) == (3, 1)


def test_live_rates_bracket_the_simulated_capacity_of_the_same_setup() -> None:
    summary = [
        {"workload": "conversations", "config": "block", "num_requests": 4000, "seed": 0,
         "capacity_rps": 50.0},
        {"workload": "conversations", "config": "block", "num_requests": 1000, "seed": 0,
         "capacity_rps": 80.0},
        {"workload": "conversations", "config": "llumnix", "num_requests": 4000, "seed": 0,
         "capacity_rps": None},
    ]
    around = stats.rates_around_simulated
    assert around(summary, workload="conversations", policy="block", num_requests=4000, seed=0,
                  spread=0.1) == [45.0, 55.0]
    # Another request count, seed or policy is another setup; no capacity found is none.
    assert around(summary, workload="conversations", policy="block", num_requests=4000, seed=1,
                  spread=0.1) is None
    assert around(summary, workload="conversations", policy="llumnix", num_requests=4000,
                  seed=0, spread=0.1) is None
    # Another emulated GPU is another setup too.
    summary[0]["model"] = "qwen2-7b-a30"
    assert around(summary, workload="conversations", policy="block", num_requests=4000, seed=0,
                  spread=0.1, model="qwen2-7b-a30") == [45.0, 55.0]
    assert around(summary, workload="conversations", policy="block", num_requests=4000, seed=0,
                  spread=0.1, model="llama-2-7b-a30") is None


def test_engine_stall_counts_time_beyond_the_steps_only_while_work_waits() -> None:
    step = stats.StepRecord
    steps = [step(0.0, 0.1, True), step(0.1, 0.1, True),  # on time
             step(0.5, 0.1, False),  # 0.3 s late: the thread did not run
             step(9.0, 0.1, True),  # after idling: the gap is no stall
             step(9.12, 0.1, True), step(9.2, 0.1, True)]  # late 0.02, then caught up
    stall = stats.engine_stall(steps)
    assert stall.busy_s == pytest.approx(0.1 + 0.4 + 0.12 + 0.08)
    assert stall.stalled_s == pytest.approx(0.3 + 0.02 - 0.02)
    assert stall.worst_gap_s == pytest.approx(0.3)
    assert stall.share == pytest.approx(0.3 / 0.7)
    assert stats.engine_stall([step(0.0, 0.1, False)]).share is None


def test_live_points_are_put_beside_the_simulated_ones_of_the_same_fleet_policy_and_rate() -> None:
    fleet = "4xllama-2-7b-a100+8xllama-2-7b-a30"
    live = {"fleet_label": fleet, "requests": 2000, "seed": 0, "policies": ["block_slo"],
            "points": [{"policy": "block_slo", "rate": 58.0, "stopped_early": False,
                        "ttft_s": {"p50": 0.05, "p99": 0.40}, "e2e_s": {"p50": 9.0, "p99": 30.0}}]}
    point = {"config": "block_slo", "rate": 58.0, "ttft_p50_s": 0.04, "ttft_p99_s": 0.32,
             "e2e_p50_s": 9.0, "e2e_p99_s": 24.0}
    simulated = {"models": [{"model": "12xqwen2-7b-a30", "points": [dict(point, rate=1.0)]},
                            {"model": fleet, "points": [point]}]}
    table = report.versus_simulated_points(live, simulated)
    assert [c._cells for c in table.columns][2] == ["live", "simulated", "live / simulated"]
    assert [c._cells for c in table.columns][4][2] == "1.250"  # TTFT p99 0.40 / 0.32
