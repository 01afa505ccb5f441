"""The autoscaling benchmark's day (issue 42): a day-shaped two-model trace, the fleets it runs on,
and the figures a run gives. Pure: the run itself is `benchmarks.autoscale_run`.

**The trace.** The Azure LLM inference trace holds one hour of arrivals. Its arrival pattern
(bursts and lulls, rescaled to a mean rate of one) is laid over a diurnal curve by time change:
arrival i of the unit-rate trace happens at Λ⁻¹(uᵢ), where Λ is the cumulative intensity of the
day. The trace is cycled when the day needs more arrivals than it holds. The day is compressed:
`day_s` emulated seconds stand for 24 hours.

- **chat** (the conversation trace's lengths and bursts) follows `diurnal(hour) = TROUGH + (1 -
  TROUGH) * sin²(π (hour - 3) / 24)`: the trough at 03:00, the peak at 15:00, peak to trough
  1 / TROUGH = 6.7 to 1.
- **code** (the code trace) is idle for long stretches: it runs only in office windows (09:00 to
  11:30 and 14:00 to 16:30 by default) at a flat rate, and not at all in between. It sleeps at
  zero and wakes with a cold start twice a day.

**The fleets.** Both use the same entries (GPU kinds, prices, cold starts). The static fleet has,
for every entry, the count the autoscaler's own decision wants at the day's peak minute (the
same sizing code, `workers.autoscale.decide`). The autoscaled fleet starts at each entry's
min_count.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from workers.autoscale.decide import Arrival, AutoscalePolicy, Autoscaler, EntryState, Sizer
from workers.cluster_sim import Workload

__all__ = ["TROUGH", "DayFigures", "DayRequest", "Outcome", "Sample", "day_trace", "diurnal",
           "figures", "gpu_hours", "office", "peak_counts", "replay_decisions"]

#: The diurnal curve's trough, as a share of its peak (peak to trough = 1 / TROUGH).
TROUGH = 0.15
#: Office windows (hours of the day) in which the "code" model has traffic.
CODE_WINDOWS = ((9.0, 11.5), (14.0, 16.5))


def diurnal(hour: float) -> float:
    """The day's load at `hour` (0-24) as a share of its peak: TROUGH at 03:00, 1 at 15:00."""
    return TROUGH + (1 - TROUGH) * math.sin(math.pi * (hour - 3.0) / 24.0) ** 2


def office(hour: float, windows: Sequence[tuple[float, float]] = CODE_WINDOWS) -> float:
    """1 inside an office window, 0 outside."""
    return 1.0 if any(start <= hour % 24 < end for start, end in windows) else 0.0


@dataclass(frozen=True, slots=True)
class DayRequest:
    """One request of the day."""

    at_s: float  # emulated seconds from the start of the day
    model: str
    prompt_tokens: int
    output_tokens: int


def _time_changed(unit: Workload, model: str, intensity: Sequence[float], step_s: float,
                  scale_rps: float, max_model_len: int) -> list[DayRequest]:
    """Arrivals of `unit` (mean rate 1) under the intensity `scale_rps * intensity[k]` over
    steps of `step_s`, the unit trace cycled as often as needed."""
    cumulative = [0.0]
    for value in intensity:
        cumulative.append(cumulative[-1] + value * scale_rps * step_s)
    total = cumulative[-1]
    span = unit.unit_arrival_s[-1] + 1.0  # one cycle of the unit trace (mean rate 1)
    out: list[DayRequest] = []
    cycle = 0
    while True:
        for index, u in enumerate(unit.unit_arrival_s):
            mass = cycle * span + u
            if mass >= total:
                return out
            k = bisect.bisect_right(cumulative, mass) - 1
            within = (mass - cumulative[k]) / max(cumulative[k + 1] - cumulative[k], 1e-12)
            prompt = min(unit.num_prompt_tokens[index], max_model_len // 2)
            output = max(1, min(unit.num_output_tokens[index], max_model_len - prompt))
            out.append(DayRequest((k + within) * step_s, model, prompt, output))
        cycle += 1


def day_trace(chat: Workload, code: Workload, *, day_s: float, chat_peak_rps: float,
              code_rps: float, max_model_len: int = 4096, step_s: float = 1.0
              ) -> list[DayRequest]:
    """The day's requests of both models, in arrival order (emulated seconds)."""
    steps = int(day_s / step_s)
    hours = [24.0 * (k + 0.5) * step_s / day_s for k in range(steps)]
    requests = _time_changed(chat, "chat", [diurnal(h) for h in hours], step_s,
                             chat_peak_rps, max_model_len)
    requests += _time_changed(code, "code", [office(h) for h in hours], step_s, code_rps,
                              max_model_len)
    return sorted(requests, key=lambda r: r.at_s)


def peak_counts(trace: Sequence[DayRequest], entries: Sequence[EntryState], sizer: Sizer,
                policy: AutoscalePolicy) -> dict[int, int]:
    """Entry index -> instances the autoscaler's decision wants at each model's busiest
    `policy.recent_s` of the day: the static fleet sized for the peak."""
    counts: dict[int, int] = {}
    for model in sorted({e.model for e in entries}):
        times = [r.at_s for r in trace if r.model == model]
        if not times:
            counts.update({e.entry_index: e.min_count for e in entries if e.model == model})
            continue
        # The end of the busiest window of recent_s.
        best_end, best = times[0], 0
        for i, t in enumerate(times):
            n = i - bisect.bisect_left(times, t - policy.recent_s) + 1
            if n > best:
                best_end, best = t, n
        history = [Arrival(r.at_s, r.prompt_tokens, r.output_tokens) for r in trace
                   if r.model == model and best_end - policy.window_s <= r.at_s <= best_end]
        pool = [dataclasses.replace(e, running=0) for e in entries if e.model == model]
        decision, = Autoscaler(policy, sizer).decide(best_end, pool, {model: history})
        counts.update(decision.desired)
    return counts


@dataclass(frozen=True, slots=True)
class Sample:
    """The fleet at one moment of a run."""

    at_s: float  # emulated seconds from the start of the day
    running: Mapping[str, int]  # GPU kind -> instances up or starting (billed)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request as the run saw it."""

    model: str
    arrived_at_zero: bool  # its model had no live instance when it was sent
    status: str  # its final status ("missing" if never seen again)
    ttft_s: float | None  # emulated seconds, arrival to first token
    times_succeeded: int  # 'succeeded' events in its history (more than one: done twice)
    webhooks: int  # completion events the receiver got for it (distinct events)


@dataclass
class DayFigures:
    """What one run (autoscaled or static) gives."""

    label: str
    gpu_hours_weighted: float  # sum of price x instance-hours (emulated hours)
    num_requests: int
    num_within_target: int  # of those not arrived at zero
    num_measured: int  # requests not arrived at zero
    num_at_zero: int
    at_zero_ttft_s: list[float] = field(default_factory=list)
    num_lost: int = 0
    num_twice: int = 0
    num_missing_webhooks: int = 0
    num_scale_downs: int = 0

    @property
    def share_within_target(self) -> float:
        return self.num_within_target / self.num_measured if self.num_measured else math.nan


def gpu_hours(samples: Sequence[Sample], prices: Mapping[str, float], end_s: float) -> float:
    """Price-weighted instance-hours: each sample's fleet held until the next (or `end_s`)."""
    total = 0.0
    for index, sample in enumerate(samples):
        until = samples[index + 1].at_s if index + 1 < len(samples) else end_s
        cost = sum(prices.get(kind, 1.0) * n for kind, n in sample.running.items())
        total += cost * max(0.0, until - sample.at_s) / 3600.0
    return total


def figures(label: str, outcomes: Sequence[Outcome], samples: Sequence[Sample],
            prices: Mapping[str, float], ttft_target_s: Mapping[str, float], end_s: float,
            num_scale_downs: int = 0) -> DayFigures:
    """The run's figures; TTFT shares leave out the requests that arrived at zero."""
    measured = [o for o in outcomes if not o.arrived_at_zero]
    within = sum(1 for o in measured if o.status == "succeeded" and o.ttft_s is not None
                 and o.ttft_s <= ttft_target_s[o.model])
    at_zero = [o for o in outcomes if o.arrived_at_zero]
    return DayFigures(
        label, gpu_hours(samples, prices, end_s), len(outcomes), within, len(measured),
        len(at_zero), sorted(o.ttft_s for o in at_zero if o.ttft_s is not None),
        num_lost=sum(1 for o in outcomes if o.status != "succeeded"),
        num_twice=sum(1 for o in outcomes if o.times_succeeded > 1),
        num_missing_webhooks=sum(1 for o in outcomes
                                 if o.status == "succeeded" and o.webhooks == 0),
        num_scale_downs=num_scale_downs)


def replay_decisions(trace: Sequence[DayRequest], entries: Sequence[EntryState], sizer: Sizer,
                     policy: AutoscalePolicy, *, interval_s: float, day_s: float
                     ) -> tuple[list[Sample], int]:
    """The autoscaler's decisions over the day with no pipeline (a dry run): every `interval_s`
    the decision on the history so far, applied at once (a cold start is not waited for), as
    the fleet per GPU kind after each decision, and the number of scale-downs. Deterministic:
    what the live run should come near, cold starts aside."""
    scaler = Autoscaler(policy, sizer)
    running = {e.entry_index: e.min_count for e in entries}
    samples: list[Sample] = []
    num_downs = 0
    start = 0
    history: dict[str, list[Arrival]] = {}
    t = 0.0
    while t < day_s:
        while start < len(trace) and trace[start].at_s <= t:
            r = trace[start]
            history.setdefault(r.model, []).append(Arrival(r.at_s, r.prompt_tokens,
                                                           r.output_tokens))
            start += 1
        window = {m: [a for a in arrivals if a.arrival_s >= t - policy.window_s]
                  for m, arrivals in history.items()}
        history = window
        now = [dataclasses.replace(e, running=running[e.entry_index]) for e in entries]
        for decision in scaler.decide(t, now, window):
            num_downs += decision.action == "down"
            running.update(decision.desired)
        by_kind: dict[str, int] = {}
        for e in entries:
            by_kind[e.gpu_kind] = by_kind.get(e.gpu_kind, 0) + running[e.entry_index]
        samples.append(Sample(t, by_kind))
        t += interval_s
    return samples, num_downs
