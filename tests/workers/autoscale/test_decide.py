"""The autoscaling decision: up at once on the cheapest kind, down slowly from the most expensive,
within each entry's bounds, to zero and back."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from workers.autoscale.decide import (
    Arrival,
    AutoscalePolicy,
    Autoscaler,
    EntryState,
    SaturationSizer,
    forecast_rate,
)


@dataclass
class FixedSizer:
    """Each entry serves `capacity[gpu_kind]` requests per second; TTFT unknown."""

    capacity: Mapping[str, float]

    def capacity_rps(self, entry: EntryState, sample: Sequence[Arrival]) -> float:
        return self.capacity[entry.gpu_kind]

    def predicted_ttft_p99_s(self, pool: Mapping[EntryState, int], sample: Sequence[Arrival],
                             rate_rps: float) -> float | None:
        return None


def _steady(rate: float, until_s: float, start_s: float = 0.0) -> list[Arrival]:
    count = int((until_s - start_s) * rate)
    return [Arrival(start_s + (i + 0.5) / rate, 200, 100) for i in range(count)]


def _entry(index: int, kind: str, running: int, price: float | None, *, low: int = 0,
           high: int = 8, model: str = "chat") -> EntryState:
    return EntryState(index, model, kind, "llama-2-7b-a30", low, high, running, price)


POLICY = AutoscalePolicy(headroom=1.0, window_s=120, recent_s=60, bucket_s=10, horizon_s=0,
                         scale_down_after_s=100, down_margin=1.0)
SIZER = FixedSizer({"cheap": 1.0, "fast": 4.0, "plain": 1.0})


def test_up_at_once_on_the_kind_that_closes_the_gap_at_the_lowest_cost() -> None:
    # A gap of 3 req/s: three cheap ones ($3) or one fast one ($2.5).
    pool = [_entry(0, "cheap", 1, 1.0), _entry(1, "fast", 0, 2.5)]
    decision, = Autoscaler(POLICY, SIZER).decide(600, pool, {"chat": _steady(4.0, 600)})
    assert decision.action == "up"
    assert decision.desired == {0: 1, 1: 1}
    assert decision.cost_per_hour == 3.5 and decision.capacity_rps == 5.0
    assert "+1 fast" in decision.reason and "rate 4.00 req/s" in decision.reason


def test_a_gap_no_one_kind_closes_takes_the_most_capacity_per_dollar_first() -> None:
    pool = [_entry(0, "cheap", 0, 1.0, high=2), _entry(1, "fast", 0, 2.5, high=1)]
    decision, = Autoscaler(POLICY, SIZER).decide(600, pool, {"chat": _steady(6.0, 600)})
    assert decision.desired == {0: 2, 1: 1}  # all it has: 6 req/s


def test_down_only_after_the_surplus_lasts_and_the_most_expensive_first() -> None:
    pool = [_entry(0, "cheap", 2, 1.0), _entry(1, "fast", 1, 2.5)]
    scaler = Autoscaler(POLICY, SIZER)
    history = {"chat": _steady(1.5, 1000)}
    first, = scaler.decide(600, pool, history)
    assert first.action == "hold" and "surplus for 0 s" in first.reason
    assert scaler.decide(650, pool, history)[0].action == "hold"
    later, = scaler.decide(700, pool, history)
    assert later.action == "down" and later.desired == {0: 2, 1: 0}
    assert "-1 fast" in later.reason
    # The next removal waits its own delay again.
    pool = [_entry(0, "cheap", 2, 1.0), _entry(1, "fast", 0, 2.5)]
    assert scaler.decide(710, pool, history)[0].action == "hold"


def test_a_burst_restarts_the_scale_down_clock() -> None:
    pool = [_entry(0, "plain", 3, None)]
    scaler = Autoscaler(POLICY, SIZER)
    assert scaler.decide(600, pool, {"chat": _steady(1.0, 600)})[0].action == "hold"
    burst = _steady(1.0, 640) + _steady(8.0, 650, start_s=640)
    assert scaler.decide(650, pool, {"chat": burst})[0].action == "up"
    quiet = burst + _steady(1.0, 760, start_s=650)
    assert scaler.decide(720, pool, {"chat": quiet})[0].action == "hold"  # clock restarted


def test_an_idle_model_sleeps_at_zero_and_a_waiting_request_wakes_it() -> None:
    pool = [_entry(0, "plain", 1, None)]
    scaler = Autoscaler(POLICY, SIZER)
    old = {"chat": _steady(1.0, 100)}  # nothing in the last 120 s at 400
    assert scaler.decide(400, pool, old)[0].action == "hold"
    asleep, = scaler.decide(500, pool, old)
    assert asleep.action == "down" and asleep.desired == {0: 0}
    pool = [_entry(0, "plain", 0, None)]
    woken, = scaler.decide(600, pool, {"chat": [Arrival(599.5, 100, 50)]}, {"chat": 1})
    assert woken.action == "up" and woken.desired == {0: 1}
    assert "1 waiting at zero" in woken.reason


def test_min_count_holds_without_demand_and_unpriced_entries_fill_in_order() -> None:
    pool = [_entry(0, "plain", 0, None, low=1, high=2), _entry(1, "plain", 0, None, high=3)]
    decision, = Autoscaler(POLICY, SIZER).decide(600, pool, {"chat": _steady(4.0, 600)})
    assert decision.desired == {0: 2, 1: 2}
    assert decision.cost_per_hour is None
    idle, = Autoscaler(POLICY, SIZER).decide(600, pool, {})
    assert idle.desired == {0: 1, 1: 0}


@settings(max_examples=150, deadline=None)
@given(rate=st.floats(0, 30), running=st.lists(st.integers(0, 6), min_size=2, max_size=2),
       bounds=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=2, max_size=2),
       waiting=st.integers(0, 3), prices=st.sampled_from([(1.0, 2.5), (None, None)]))
def test_desired_stays_within_bounds_and_covers_demand_where_it_can(
        rate: float, running: list[int], bounds: list[tuple[int, int]], waiting: int,
        prices: tuple) -> None:
    pool = [_entry(i, kind, running[i], prices[i], low=min(b), high=min(b) + max(b))
            for i, (kind, b) in enumerate(zip(("cheap", "fast"), bounds, strict=True))]
    history = {"chat": _steady(rate, 600) if rate > 0.05 else []}
    decision, = Autoscaler(POLICY, SIZER).decide(600, pool, history, {"chat": waiting})
    for entry in pool:
        assert entry.min_count <= decision.desired[entry.entry_index] <= entry.max_count
    full = sum(SIZER.capacity[e.gpu_kind] * e.max_count for e in pool)
    assert decision.capacity_rps >= min(decision.target_rps, full) - 1e-9
    if waiting and sum(e.max_count for e in pool):
        assert sum(decision.desired.values()) >= 1
    assert decision.action != "down"  # the first decision never removes


@given(rate=st.floats(0.1, 50))
def test_the_forecast_of_a_steady_rate_is_that_rate(rate: float) -> None:
    times = [i / rate for i in range(math.ceil(300 * rate))]  # every arrival before now
    # A 10 s bucket counts whole arrivals: at low rates one more or less is 0.1 req/s, which
    # the trend projects 6 buckets ahead (the worst on a fine grid of rates: 0.12 req/s).
    assert abs(forecast_rate(times, 300, window_s=300, bucket_s=10, horizon_s=60) - rate) \
        <= 0.15 * rate + 1.5 / 10


def test_the_forecast_sees_a_ramp_coming() -> None:
    times = [t for second in range(300) for t in [second + k / (1 + second // 30)
                                                  for k in range(1 + second // 30)]]
    now = forecast_rate(times, 300, window_s=300, bucket_s=10, horizon_s=0)
    ahead = forecast_rate(times, 300, window_s=300, bucket_s=10, horizon_s=60)
    assert ahead > now > 8


def test_the_simulation_sizes_a_faster_kind_larger_and_predicts_a_ttft() -> None:
    sizer = SaturationSizer(max_model_len=4096)
    sample = [Arrival(i / 4, 300 + 37 * (i % 11), 80 + 23 * (i % 7)) for i in range(120)]
    a30 = _entry(0, "a30", 1, 0.9)
    h100 = EntryState(1, "chat", "h100", "llama-2-7b-h100", 0, 2, 0, 4.5)
    assert sizer.capacity_rps(h100, sample) > 1.5 * sizer.capacity_rps(a30, sample)
    ttft = sizer.predicted_ttft_p99_s({a30: 2}, sample, 1.0)
    assert ttft is not None and 0 < ttft < 5


def test_a_late_batch_asks_for_capacity_until_it_has_it() -> None:
    """A batch estimated to finish after its window lacks 2.5 lines a second: the model gets
    instances for it on top of its interactive rate, and says why."""
    pool = [_entry(0, "cheap", 1, 1.0), _entry(1, "fast", 0, 2.5)]
    history = {"chat": _steady(1.0, 600)}
    scaler = Autoscaler(POLICY, SIZER)
    alone, = scaler.decide(600, pool, history)
    late, = scaler.decide(600, pool, history, batch_rps={"chat": 2.5})
    assert alone.action == "hold" and alone.desired == {0: 1, 1: 0}
    assert late.action == "up" and late.target_rps == 3.5 and late.capacity_rps >= 3.5
    assert "late batches lack 2.50 lines/s" in late.reason
    # A model at zero with only a late batch (no interactive history) wakes for it.
    asleep = [_entry(0, "cheap", 0, 1.0)]
    woken, = scaler.decide(600, asleep, {"chat": _steady(1.0, 100)}, batch_rps={"chat": 1.0})
    assert woken.desired == {0: 1}
