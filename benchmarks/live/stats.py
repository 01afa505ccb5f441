"""Pure parts of the live benchmark: time conversion, latency summaries, the capacity search.

Times: the emulated engines run in scaled time, `time_scale` wall seconds per emulated second
(Settings.emulated_time_scale). Every latency the benchmark reports is in emulated seconds (wall
seconds / time_scale), every rate in emulated requests per second (wall rate x time_scale), so
that they compare with the paper's GPUs and with the discrete-event benchmark.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from benchmarks.stats import percentile, percentile_certainly_above

__all__ = ["LatencySummary", "CapacityResult", "RequestProgress", "count_done_and_late",
           "emulated_s", "wall_rate", "percentile", "percentile_certainly_above", "summarize",
           "search_capacity", "rates_around_simulated", "StepRecord", "EngineStall",
           "engine_stall"]


def emulated_s(wall_s: float, time_scale: float) -> float:
    """A duration measured in wall seconds, in emulated seconds."""
    if time_scale <= 0:
        raise ValueError(f"time_scale must be positive, got {time_scale}")
    return wall_s / time_scale


def wall_rate(emulated_rate: float, time_scale: float) -> float:
    """Requests per wall second that make `emulated_rate` requests per emulated second."""
    if time_scale <= 0:
        raise ValueError(f"time_scale must be positive, got {time_scale}")
    return emulated_rate / time_scale


@dataclass(frozen=True, slots=True)
class RequestProgress:
    """A request as PostgreSQL shows it mid-run (times in epoch seconds)."""

    request_id: str
    ended: bool  # succeeded, failed or cancelled
    created: float
    first_token: float | None  # written with the completion: None while it runs
    not_admitted: bool  # no engine worker has taken it yet (started_at unset)


def count_done_and_late(requests: Sequence[RequestProgress], waiting_since: dict[str, float],
                        read_at: float, slo_s: float) -> tuple[int, int]:
    """(ended, certainly later than `slo_s`) among `requests`.

    Late only when certain: ended with its first token past the SLO or without one; shown
    without output in an engine state taken (`waiting_since`, read before the rows) past the
    SLO; or not admitted by `read_at` (the rows' read) past the SLO. A running request whose
    state shows output, or that was admitted after its engine's state was taken, is not late
    yet, whatever its age.
    """
    done = late = 0
    for r in requests:
        if r.ended:
            done += 1
            late += r.first_token is None or r.first_token - r.created > slo_s
        elif r.request_id in waiting_since:
            late += waiting_since[r.request_id] - r.created > slo_s
        elif r.not_admitted:
            late += read_at - r.created > slo_s
    return done, late


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """p50/p99 of one latency, emulated seconds."""

    p50: float
    p99: float
    count: int

    def as_dict(self) -> dict[str, float]:
        return {"p50": self.p50, "p99": self.p99, "count": self.count}


def summarize(wall_latencies_s: Sequence[float], time_scale: float) -> LatencySummary:
    """Wall-second latencies (inf: never happened) as an emulated-second summary."""
    values = [emulated_s(v, time_scale) for v in wall_latencies_s]
    return LatencySummary(percentile(values, 50), percentile(values, 99), len(values))


@dataclass(frozen=True, slots=True)
class CapacityResult:
    """Highest rate that met the SLO (None: not even the lowest tried) and the lowest that did
    not (None: none failed), with every rate tried and its measure."""

    capacity: float | None
    first_failing: float | None
    tried: dict[float, float]


def search_capacity(measure: Callable[[float], float], rates: Sequence[float], slo: float, *,
                    bisect_steps: int = 2, resolution: float = 0.0) -> CapacityResult:
    """The highest rate whose `measure(rate)` (TTFT p99) is at most `slo`.

    Tries `rates` in ascending order and stops at the first that fails (latency grows with the
    rate: higher ones would fail too); then bisects `bisect_steps` times between the highest
    passing and the lowest failing rate, stopping early once they are `resolution` apart.
    """
    ordered = sorted(set(rates))
    if not ordered:
        raise ValueError("need at least one rate")
    tried: dict[float, float] = {}
    passing: float | None = None
    failing: float | None = None
    for rate in ordered:
        tried[rate] = measure(rate)
        if tried[rate] <= slo:
            passing = rate
        else:
            failing = rate
            break
    if passing is None or failing is None:
        return CapacityResult(passing, failing, tried)
    for _ in range(bisect_steps):
        if failing - passing <= resolution:
            break
        rate = round((passing + failing) / 2, 6)
        tried[rate] = measure(rate)
        if tried[rate] <= slo:
            passing = rate
        else:
            failing = rate
    return CapacityResult(passing, failing, tried)


def rates_around_simulated(summary: Sequence[dict], *, workload: str, policy: str,
                           num_requests: int, seed: int, spread: float,
                           model: str | None = None) -> list[float] | None:
    """The rates a live capacity search tries around the discrete-event benchmark's capacity
    for the same workload, policy, request count, seed and (when given) model (the `summary`
    rows of `bench_cluster.py --json`): capacity x (1 - spread) and x (1 + spread). Passing the
    first and failing the second puts the live capacity within `spread` of the simulated one.
    None when the summary has no such row or no capacity.
    """
    for row in summary:
        if (row.get("workload"), row.get("config"), row.get("num_requests"), row.get("seed")) \
                == (workload, policy, num_requests, seed) and row.get("capacity_rps") and (
                    model is None or row.get("model") == model):
            capacity = float(row["capacity_rps"])
            return [round(capacity * (1 - spread), 2), round(capacity * (1 + spread), 2)]
    return None


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step as its sample records it: when it ended (wall seconds), how long the
    emulated GPU took (wall seconds, time scale applied), and whether work was left after it."""

    at_s: float
    duration_s: float
    work_left: bool


@dataclass(frozen=True, slots=True)
class EngineStall:
    """Wall time an engine had work but was not stepping, over the time it had work."""

    busy_s: float  # wall time between a step that left work and the step after it
    stalled_s: float  # of that, the time beyond the next step's emulated duration
    worst_gap_s: float  # the longest such excess between two steps

    @property
    def share(self) -> float | None:
        return self.stalled_s / self.busy_s if self.busy_s > 0 else None


def engine_stall(steps: Sequence[StepRecord]) -> EngineStall:
    """How far one emulated engine ran behind its own clock, from its steps in time order.

    A step that leaves work is followed at once by the next (the engine loop does not wait),
    so the gap between their ends should be the next step's duration; what is beyond it is
    time the engine thread did not get (a busy CPU, the interpreter lock, its own lock held
    by others). An emulated GPU that stalls is slower than the GPU it stands for: latency it
    adds is the emulator's, not the scheduler's.
    """
    busy = stalled = worst = 0.0
    for before, step in itertools.pairwise(steps):
        if not before.work_left:
            continue  # idle until work came: the gap says nothing
        gap = step.at_s - before.at_s
        busy += gap
        excess = gap - step.duration_s
        stalled += excess  # NOTE: may be negative: the clock catches up on small lateness
        worst = max(worst, excess)
    return EngineStall(busy_s=busy, stalled_s=max(0.0, stalled), worst_gap_s=worst)
