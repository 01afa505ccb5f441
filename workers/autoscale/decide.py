"""The autoscaling decision: each model's desired instances per fleet entry, from its recent demand.

One decision, every interval, over the whole fleet:

1. **Demand.** The model's requests of the last `window_s` (arrival time, prompt and output
   tokens). Its rate now is the arrivals of the last `recent_s`; a short forecast (Holt's linear
   smoothing over `bucket_s` buckets) looks `horizon_s` ahead, as far as a cold start and the
   next decision reach. The rate to serve is the larger of the two times `headroom`.
2. **Capacity.** Each entry's capacity per instance on the model's own recent lengths, from the
   simulation (`Sizer`: `SaturationSizer` runs `workers.cluster_sim.saturation_rate` on each
   kind; the fleet planner's search can stand in for it behind the same interface).
3. **Up fast.** Below the rate to serve, instances are added at once: on the entry (GPU kind)
   that closes the gap at the lowest price, or, where no one kind can, on the one with the most
   capacity per dollar, and again. Without prices, entries fill in declaration order.
4. **Down slowly.** Above it (with a `down_margin` dead band), the most expensive instance
   whose removal still leaves the rate covered is surplus; it is removed only once it has been
   surplus, decision after decision, for `scale_down_after_s`, and one instance per model per
   decision. A scale-up restarts that clock.
5. **Zero.** A model with no request in the window goes to its entries' min_count (0 lets it
   sleep), through the same slow path; a request for a model at zero asks for one instance at
   once.
6. **Late batches.** A running batch whose completion estimate falls after its completion
   window asks for the lines a second it lacks (`batch_rps`: what finishing in time needs less
   what the estimate says it gets), on top of the rate to serve, until it is back in time.

Every decision carries its reason (rate, forecast, capacity, predicted TTFT, cost). Pure: the
clock, the history and the fleet's state are passed in; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from workers.cluster_sim import (
    ClusterSetup,
    FleetMember,
    MeanPredictor,
    Workload,
    saturation_rate,
    simulate,
)
from workers.sim import exec_model_of
from workers.sim.hardware import instance_config

__all__ = [
    "Arrival",
    "Autoscaler",
    "AutoscalePolicy",
    "EntryState",
    "ModelDecision",
    "SaturationSizer",
    "Sizer",
    "forecast_rate",
]

Action = Literal["up", "down", "hold"]


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request of the recent history."""

    arrival_s: float  # on the decision's clock
    prompt_tokens: int
    output_tokens: int  # the real length once known, else the predicted or requested one


@dataclass(frozen=True, slots=True)
class EntryState:
    """One fleet entry (a model on one GPU kind) as the autoscaler sees it now."""

    entry_index: int  # its place in BLOCKQ_FLEET
    model: str
    gpu_kind: str  # its catalog name, else its execution-time model's
    exec_model: str  # the execution-time model of its hardware (bundled name)
    min_count: int
    max_count: int
    running: int  # instances live or starting now
    price_per_hour: float | None = None  # from the catalog; None: unpriced
    num_blocks: int | None = None  # its KV blocks, where the entry sets them
    max_num_seqs: int | None = None


@dataclass(frozen=True, slots=True)
class AutoscalePolicy:
    """The knobs of the decision (from Settings: autoscale_*)."""

    headroom: float = 1.25  # capacity kept over the rate to serve
    window_s: float = 300.0  # history the demand is read from
    recent_s: float = 60.0  # arrivals this recent give the rate now
    bucket_s: float = 10.0  # forecast buckets
    horizon_s: float = 60.0  # how far the forecast looks (cold start + an interval)
    scale_down_after_s: float = 300.0  # surplus this long before an instance is removed
    down_margin: float = 1.1  # remove only while capacity stays above rate x this
    max_sample: int = 200  # recent requests the simulation sizes with


@dataclass(frozen=True, slots=True)
class ModelDecision:
    """What the autoscaler wants for one model, and why."""

    model: str
    action: Action
    #: entry_index -> desired instances (every entry of the model).
    desired: dict[int, int]
    rate_rps: float  # arrivals per second over the last recent_s
    forecast_rps: float  # the forecast horizon_s ahead
    target_rps: float  # max(rate, forecast) x headroom: what the fleet must serve
    capacity_rps: float  # of the desired fleet
    predicted_ttft_p99_s: float | None  # of the desired fleet at the rate now (simulated)
    cost_per_hour: float | None  # of the desired fleet (None: unpriced entries)
    reason: str


class Sizer(Protocol):
    """What one instance of an entry serves, and how a pool would do: the simulation behind
    the decision (the planner's search can implement it too)."""

    def capacity_rps(self, entry: EntryState, sample: Sequence[Arrival]) -> float:
        """Requests per second one instance of `entry` completes on requests like `sample`."""
        ...

    def predicted_ttft_p99_s(self, pool: Mapping[EntryState, int], sample: Sequence[Arrival],
                             rate_rps: float) -> float | None:
        """TTFT p99 of `pool` (entry -> instances) serving `sample` at `rate_rps`."""
        ...


@dataclass
class SaturationSizer:
    """Capacity by `saturation_rate` per kind on the model's recent lengths; TTFT p99 by a short
    `simulate` run of the pool under `policy` (the production default for the pool).

    `time_scale`: wall seconds per emulated second of an emulated fleet (its engines run that
    much faster): capacities and TTFTs are given on the wall clock the demand is measured on."""

    max_model_len: int = 4096
    time_scale: float = 1.0
    policy_alike: str = "round_robin"
    policy_mixed: str = "block_slo"
    num_ttft_requests: int = 120
    _cache: dict[tuple, float] = field(default_factory=dict, repr=False)

    def capacity_rps(self, entry: EntryState, sample: Sequence[Arrival]) -> float:
        workload = _workload(sample, self.max_model_len)
        # NOTE: lengths rounded to a 10 % grid key the cache: demand that did not change
        # shape is not simulated again every interval.
        key = (entry.exec_model, entry.num_blocks, entry.max_num_seqs, _shape(workload))
        if key not in self._cache:
            member = self._member(entry)
            self._cache[key] = saturation_rate(workload, member.config, member.exec_model)
        return self._cache[key] / self.time_scale

    def predicted_ttft_p99_s(self, pool: Mapping[EntryState, int], sample: Sequence[Arrival],
                             rate_rps: float) -> float | None:
        members = [self._member(e) for e, n in pool.items() for _ in range(n)]
        if not members or rate_rps <= 0 or not sample:
            return None
        workload = _workload(sample[-self.num_ttft_requests:], self.max_model_len)
        mixed = len({(m.exec_model.name, m.config) for m in members}) > 1
        result = simulate(workload, rate_rps * self.time_scale, ClusterSetup.of_fleet(members),
                          self.policy_mixed if mixed else self.policy_alike, MeanPredictor())
        return result.ttft_p99_s * self.time_scale

    def _member(self, entry: EntryState) -> FleetMember:
        sized = {name: value for name, value in (("num_total_blocks", entry.num_blocks),
                                                 ("max_num_seqs", entry.max_num_seqs))
                 if value is not None}
        config = instance_config(entry.exec_model, max_model_len=self.max_model_len, **sized)
        return FleetMember(config, exec_model_of(entry.exec_model))


def forecast_rate(arrivals_s: Sequence[float], now_s: float, *, window_s: float,
                  bucket_s: float, horizon_s: float, alpha: float = 0.5,
                  beta: float = 0.3) -> float:
    """Arrivals per second `horizon_s` after `now_s`, by Holt's linear smoothing of the counts
    in `bucket_s` buckets over the last `window_s` (never below 0)."""
    num_buckets = max(1, int(window_s // bucket_s))
    start_s = now_s - num_buckets * bucket_s
    counts = [0] * num_buckets
    for t in arrivals_s:
        if start_s <= t < now_s:
            counts[min(num_buckets - 1, int((t - start_s) // bucket_s))] += 1
        elif t == now_s:
            counts[-1] += 1
    level, trend = counts[0] / bucket_s, 0.0
    for count in counts[1:]:
        rate = count / bucket_s
        previous = level
        level = alpha * rate + (1 - alpha) * (level + trend)
        trend = beta * (level - previous) + (1 - beta) * trend
    return max(0.0, level + trend * horizon_s / bucket_s)


@dataclass
class Autoscaler:
    """Decides every interval; remembers how long each model has had a surplus."""

    policy: AutoscalePolicy
    sizer: Sizer
    #: model -> when its current surplus began (None: no surplus).
    _surplus_since: dict[str, float] = field(default_factory=dict)

    def decide(self, now_s: float, entries: Sequence[EntryState],
               history: Mapping[str, Sequence[Arrival]],
               waiting: Mapping[str, int] | None = None,
               batch_rps: Mapping[str, float] | None = None) -> list[ModelDecision]:
        """One decision per model of `entries`. `history`: each model's arrivals (any order,
        any age: those of the window count); `waiting`: requests held for a model that has no
        live instance (each asks for one at once); `batch_rps`: the lines a second each model's
        late batches lack (step 6 of the module docstring)."""
        by_model: dict[str, list[EntryState]] = {}
        for entry in entries:
            by_model.setdefault(entry.model, []).append(entry)
        return [self._decide_model(now_s, model, pool, history.get(model, ()),
                                   (waiting or {}).get(model, 0),
                                   max(0.0, (batch_rps or {}).get(model, 0.0)))
                for model, pool in by_model.items()]

    # --- one model ----------------------------------------------------------------------------
    def _decide_model(self, now_s: float, model: str, pool: list[EntryState],
                      history: Sequence[Arrival], num_waiting: int,
                      batch_rps: float) -> ModelDecision:
        policy = self.policy
        recent = sorted((a for a in history if now_s - policy.window_s <= a.arrival_s <= now_s),
                        key=lambda a: a.arrival_s)
        rate = sum(1 for a in recent if a.arrival_s >= now_s - policy.recent_s) / policy.recent_s
        forecast = forecast_rate([a.arrival_s for a in recent], now_s, window_s=policy.window_s,
                                 bucket_s=policy.bucket_s, horizon_s=policy.horizon_s)
        sample = recent[-policy.max_sample:]
        # NOTE: without a recent request there is no capacity to size a batch's need with: it
        # asks for one instance (`busy`), whose lines then size the rest.
        target = max(rate, forecast) * policy.headroom + (batch_rps if sample else 0.0)
        capacity = {e.entry_index: self.sizer.capacity_rps(e, sample) if sample else 0.0
                    for e in pool}
        current = {e.entry_index: min(max(e.running, 0), e.max_count) for e in pool}
        # A model with demand keeps one instance.
        busy = num_waiting > 0 or bool(recent) or batch_rps > 0
        wanted = self._scale_up(pool, current, capacity, target, needs_one=busy)
        action: Action = "up" if _more(wanted, current) else "hold"
        detail = ""
        if action == "up" or _removable(pool, current, capacity, target, policy,
                                        needs_one=busy) is None:
            self._surplus_since.pop(model, None)
        else:
            since = self._surplus_since.setdefault(model, now_s)
            if now_s - since >= policy.scale_down_after_s:
                wanted, removed = _remove_one(pool, current, capacity, target, policy,
                                              needs_one=busy)
                action = "down"
                detail = f"-1 {removed.gpu_kind} (surplus for {now_s - since:.0f} s)"
                self._surplus_since[model] = now_s  # the next removal waits again
            else:
                detail = (f"surplus for {now_s - since:.0f} s of "
                          f"{policy.scale_down_after_s:.0f} s")
        if action == "up":
            detail = ", ".join(f"+{wanted[e.entry_index] - current[e.entry_index]} "
                               f"{e.gpu_kind}" for e in pool
                               if wanted[e.entry_index] > current[e.entry_index])
        if batch_rps > 0:
            detail = "; ".join(filter(None, [f"late batches lack {batch_rps:.2f} lines/s",
                                             detail]))
        return self._decision(model, pool, action, wanted, capacity, sample, rate, forecast,
                              target, num_waiting, detail)

    def _scale_up(self, pool: list[EntryState], current: dict[int, int],
                  capacity: dict[int, float], target: float, *, needs_one: bool
                  ) -> dict[int, int]:
        wanted = {e.entry_index: max(current[e.entry_index], e.min_count) for e in pool}
        if needs_one and sum(wanted.values()) == 0:
            first = _cheapest_to_close(pool, wanted, capacity, 0.0)
            if first is not None:
                wanted[first.entry_index] = 1
        while (gap := target - _capacity(wanted, capacity)) > 1e-9:
            choice = _cheapest_to_close(pool, wanted, capacity, gap)
            if choice is None:
                break  # every entry at its max_count
            wanted[choice.entry_index] += 1
        return wanted

    def _decision(self, model: str, pool: list[EntryState], action: Action,
                  wanted: dict[int, int], capacity: dict[int, float],
                  sample: Sequence[Arrival], rate: float, forecast: float, target: float,
                  num_waiting: int, detail: str) -> ModelDecision:
        by_entry = {e: wanted[e.entry_index] for e in pool if wanted[e.entry_index]}
        ttft = self.sizer.predicted_ttft_p99_s(by_entry, sample, rate) if rate > 0 else None
        priced = all(e.price_per_hour is not None for e in pool)
        cost = sum((e.price_per_hour or 0.0) * n for e, n in by_entry.items()) if priced else None
        total = _capacity(wanted, capacity)
        fleet = " + ".join(f"{n} x {e.gpu_kind}" for e, n in by_entry.items()) or "0"
        reason = (f"{action}: rate {rate:.2f} req/s, forecast {forecast:.2f}, target "
                  f"{target:.2f} (x{self.policy.headroom:g}); fleet {fleet} serves "
                  f"{total:.2f} req/s"
                  + (f"; {num_waiting} waiting at zero" if num_waiting else "")
                  + (f"; predicted TTFT p99 {ttft:.2f} s" if ttft is not None else "")
                  + (f"; ${cost:.2f}/h" if cost is not None else "")
                  + (f"; {detail}" if detail else ""))
        return ModelDecision(model, action, wanted, rate, forecast, target, total, ttft, cost,
                             reason)


def _capacity(counts: Mapping[int, int], capacity: Mapping[int, float]) -> float:
    return sum(n * capacity[i] for i, n in counts.items())


def _more(wanted: Mapping[int, int], current: Mapping[int, int]) -> bool:
    return any(wanted[i] > current[i] for i in wanted)


def _price(entry: EntryState) -> float:
    return entry.price_per_hour if entry.price_per_hour is not None else 0.0


def _cheapest_to_close(pool: list[EntryState], counts: Mapping[int, int],
                       capacity: Mapping[int, float], gap: float) -> EntryState | None:
    """The entry whose next instance starts the cheapest way to close `gap`: among the kinds
    that can close it alone (within max_count), the lowest total price; if none can, the most
    capacity per dollar. Unpriced entries go in declaration order."""
    open_entries = [e for e in pool if counts[e.entry_index] < e.max_count]
    if not open_entries:
        return None
    if any(e.price_per_hour is None for e in pool):
        return open_entries[0]

    def needed(e: EntryState) -> int:
        cap = capacity[e.entry_index]
        return math.ceil(gap / cap) if cap > 0 else 1

    closing = [e for e in open_entries
               if capacity[e.entry_index] > 0
               and needed(e) <= e.max_count - counts[e.entry_index]]
    if closing:
        return min(closing, key=lambda e: (needed(e) * _price(e), e.entry_index))
    return max(open_entries, key=lambda e: (capacity[e.entry_index] / max(_price(e), 1e-9),
                                            -e.entry_index))


def _removal_order(pool: list[EntryState]) -> list[EntryState]:
    """Most expensive first (unpriced: the last declared first)."""
    return sorted(pool, key=lambda e: (-_price(e), -e.entry_index))


def _removable(pool: list[EntryState], counts: Mapping[int, int], capacity: Mapping[int, float],
               target: float, policy: AutoscalePolicy, *, needs_one: bool
               ) -> EntryState | None:
    total = _capacity(counts, capacity)
    for entry in _removal_order(pool):
        index = entry.entry_index
        if counts[index] <= entry.min_count:
            continue
        if needs_one and sum(counts.values()) <= 1:
            continue
        if total - capacity[index] >= target * policy.down_margin or target == 0:
            return entry
    return None


def _remove_one(pool: list[EntryState], current: dict[int, int], capacity: dict[int, float],
                target: float, policy: AutoscalePolicy, *, needs_one: bool
                ) -> tuple[dict[int, int], EntryState]:
    entry = _removable(pool, current, capacity, target, policy, needs_one=needs_one)
    assert entry is not None, "a surplus was seen without an instance to remove"
    return {**current, entry.entry_index: current[entry.entry_index] - 1}, entry


def _workload(sample: Sequence[Arrival], max_model_len: int) -> Workload:
    prompts, outputs = [], []
    for a in sample:
        prompt = max(1, min(a.prompt_tokens, max_model_len - 1))
        prompts.append(prompt)
        outputs.append(max(1, min(a.output_tokens, max_model_len - prompt)))
    n = len(prompts)
    return Workload("autoscale", tuple(float(i) for i in range(n)), tuple(prompts),
                    tuple(outputs))


def _shape(workload: Workload) -> tuple[int, int, int]:
    """A coarse key of a workload's lengths: its size and mean lengths on a 10 % grid."""
    def grid(x: float) -> int:
        return round(math.log(max(x, 1.0)) / math.log(1.1))
    mean_prompt = sum(workload.num_prompt_tokens) / len(workload)
    return (min(len(workload), 50) // 10, grid(mean_prompt), grid(workload.mean_output_tokens))
