"""A batch's completion estimate: its lines, at their predicted lengths, replayed on a simulation
of the fleet beside the interactive load they yield to.

Pure: no Celery, no database; the batch worker gathers the inputs (`workers/batch/eta_inputs`)
and this module answers. The fleet is each instance's own scheduler (`workers.sim.Scheduler`,
vLLM's priority policy: every interactive request before any batch line) stepped in emulated
time by the instance's execution-time model. Interactive requests arrive as a Poisson stream at
the recent rate, with shapes drawn from recent ones; the batch's lines wait in one queue and
are released up to the batch's share of the releaser's window in flight, each to the instance
with the fewest requests ahead of it, as the releaser and the router do. The releaser runs in
rounds (`EtaConfig.release_interval_s` apart): a seat a finished line frees stays empty until
the next round (with no interval, a line is released the moment one finishes), and a released
line reaches its engine only after the pipeline's measured delay (`EtaConfig.dispatch_delay_s`).

NOTE: sums of lengths decide a batch's duration, so this is where per-request length accuracy
pays: a batch of short classification prompts and one of long essays have the same line
count, and a per-model mean length gets one of them badly wrong (issue 43).

A large batch is simulated on a sample of its lines (`EtaConfig.max_lines`, drawn evenly) and
its duration scaled by the line count: once the window is full, a batch runs at a steady rate,
so its duration is linear in its lines.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from workers.sim import InstanceConfig, Scheduler, SeqState, engine_priority
from workers.sim.exec_model import ExecModel

__all__ = ["Checkpoint", "EtaConfig", "EtaInstance", "EtaLine", "Estimate", "InteractiveLoad",
           "calibrated", "estimate", "expected_tokens", "length_calibration", "replay",
           "saturated_lines_per_s"]

#: Finished lines a batch needs before its own answers correct its predicted lengths, and the
#: most the correction moves them (either way).
CALIBRATION_MIN_LINES = 20
CALIBRATION_BOUND = 2.0

#: The standard normal's 90th percentile.
_Z90 = 1.2815515655446004

#: The engines' class priorities (`Priority.rank`): interactive before batch.
_INTERACTIVE, _BATCH = 0, 1

#: `_FleetRun`'s event kinds: a step ends, an interactive request arrives, a releaser round, a
#: released line reaches its engine.
_STEP, _ARRIVAL, _ROUND, _JOIN = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class EtaLine:
    """One line still to run: its prompt and (predicted) output tokens."""

    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class EtaInstance:
    """One instance of the fleet: its scheduler's settings and its execution-time model."""

    config: InstanceConfig
    exec_model: ExecModel


@dataclass(frozen=True, slots=True)
class InteractiveLoad:
    """The interactive stream the batch yields to: its rate and a sample of its shapes
    ((prompt tokens, output tokens), drawn with replacement)."""

    rate_rps: float = 0.0
    shapes: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.rate_rps < 0 or (self.rate_rps > 0 and not self.shapes):
            raise ValueError("an interactive rate needs a non-negative rate and some shapes")


@dataclass(frozen=True, slots=True)
class EtaConfig:
    #: Batch lines in flight at most: the batch's share of the releaser's window
    #: (`Settings.max_batch_in_flight`, shared with other models' pools).
    max_in_flight: int = 256
    #: Lines simulated at most; a larger batch is sampled and its duration scaled.
    max_lines: int = 2_000
    #: Emulated seconds after which the simulation stops: the estimate is then "longer".
    max_sim_s: float = 8 * 86_400.0
    seed: int = 0
    #: Sigma of lognormal noise on every step time (0: the model's own times). A benchmark's
    #: ground truth sets it; an estimate does not.
    step_noise: float = 0.0
    #: Emulated seconds between the releaser's rounds (`Settings.batch_release_interval_s`):
    #: lines are released only at k * this (k = 0, 1, ...). 0: the moment a seat frees.
    release_interval_s: float = 0.0
    #: Emulated seconds from a line's release to its engine (its trip through the predict and
    #: route workers to the engine worker's admission): its slot in the window is taken, its
    #: seat not yet. 0: at once.
    dispatch_delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Estimate:
    """Seconds until the last line finishes (from the moment the inputs describe)."""

    seconds: float
    num_lines: int
    simulated_lines: int
    #: True when the simulation stopped at `EtaConfig.max_sim_s` (`seconds` is a lower bound).
    capped: bool = False

    @property
    def lines_per_s(self) -> float:
        return self.num_lines / self.seconds if self.seconds > 0 else math.inf


def estimate(lines: Sequence[EtaLine], fleet: Sequence[EtaInstance],
             interactive: InteractiveLoad = InteractiveLoad(),
             config: EtaConfig = EtaConfig(), *, num_lines: int | None = None) -> Estimate:
    """How long `lines` take on `fleet` beside `interactive` (0 s for no line).

    `num_lines`: the lines `lines` stand for, when they are a sample the caller drew (default:
    `lines` are all of them); the duration is scaled to it.
    """
    if not fleet:
        raise ValueError("the fleet has no instance")
    total = len(lines) if num_lines is None else num_lines
    if not lines or total <= 0:
        return Estimate(0.0, max(total, 0), 0)
    sample = _sample(lines, config.max_lines)
    seconds, capped = _FleetRun(fleet, interactive, config).run(sample)
    return Estimate(seconds * total / len(sample), total, len(sample), capped)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A replay's state once a share of its lines finished: when, and each unfinished line's
    index with the output tokens it has made."""

    at_s: float
    unfinished: tuple[tuple[int, int], ...]


def replay(lines: Sequence[EtaLine], fleet: Sequence[EtaInstance],
           interactive: InteractiveLoad = InteractiveLoad(), config: EtaConfig = EtaConfig(),
           *, checkpoint: float = 0.25) -> tuple[Estimate, Checkpoint]:
    """Every line simulated (no sampling), and the state when `checkpoint` of them had
    finished: a benchmark's ground truth, to judge estimates made then."""
    if not fleet or not lines:
        raise ValueError("a replay needs lines and a fleet")
    run = _FleetRun(fleet, interactive, config, checkpoint=checkpoint)
    seconds, capped = run.run(list(lines))
    assert run.checkpoint is not None
    return Estimate(seconds, len(lines), len(lines), capped), run.checkpoint


def saturated_lines_per_s(lines: Sequence[EtaLine], fleet: Sequence[EtaInstance],
                          config: EtaConfig = EtaConfig()) -> float:
    """Lines a second the fleet runs `lines` at alone (no interactive load): what a batch alone
    on an idle fleet should reach."""
    return estimate(lines, fleet, InteractiveLoad(), config).lines_per_s


def expected_tokens(median: int, p90: int | None, cap: int, made: int = 0) -> int:
    """A line's expected output tokens from its predicted median and 90th percentile, as a
    lognormal through both (at most `cap`); given that it has made `made` tokens and not
    finished, its expected length knowing that (never below `made` + 1).

    NOTE: a batch's duration is a sum of lengths, and answer lengths are right-skewed: the sum
    of medians falls short of the sum (by exp(sigma^2 / 2), a third at the head's typical
    spread), so the estimate uses expected values. A running line that has passed its
    predicted median is likely a long one: its remaining length is the lognormal's tail
    beyond what it made, not the median less what it made.
    """
    floor = made + 1
    if p90 is None or p90 <= median or median < 1:
        return max(floor, min(median, cap))
    sigma = math.log(p90 / median) / _Z90
    mu = math.log(median)
    if made <= 0:
        mean = math.exp(mu + sigma * sigma / 2)
    else:
        # E[L | L > m] of a lognormal: exp(mu + s^2/2) * Phi((mu + s^2 - ln m) / s)
        # / Phi((mu - ln m) / s); far in the tail, m itself plus a little.
        tail = _phi((mu - math.log(made)) / sigma)
        if tail < 1e-9:
            return max(floor, min(cap, made + 1))
        mean = (math.exp(mu + sigma * sigma / 2)
                * _phi((mu + sigma * sigma - math.log(made)) / sigma) / tail)
    return max(floor, min(cap, round(mean)))


def length_calibration(predicted: Sequence[float], actual: Sequence[int | None]) -> float:
    """How much longer (above 1) or shorter this batch's answers run than predicted: actual
    over predicted output tokens of its lines in release order up to the first one not
    finished (None), within 1 / `CALIBRATION_BOUND` and `CALIBRATION_BOUND`; 1 with fewer than
    `CALIBRATION_MIN_LINES` such lines.

    NOTE: a prefix, not every finished line: short answers finish first, so the finished
    lines alone would say that the batch's answers run shorter than they do. A batch's lines
    are alike (one job's prompts), and the head's error on them is mostly shared (a terse
    model's short answers predicted as its average ones): the first lines tell the rest.
    """
    num = next((i for i, tokens in enumerate(actual) if tokens is None), len(actual))
    if num < CALIBRATION_MIN_LINES:
        return 1.0
    expected = sum(predicted[:num])
    if expected <= 0:
        return 1.0
    ratio = sum(t for t in actual[:num] if t is not None) / expected
    return min(CALIBRATION_BOUND, max(1 / CALIBRATION_BOUND, ratio))


def calibrated(median: int, p90: int | None, ratio: float) -> tuple[int, int | None]:
    """A line's predicted median and 90th percentile scaled by its batch's `ratio`."""
    return (max(1, round(median * ratio)),
            None if p90 is None else max(1, round(p90 * ratio)))


def _phi(x: float) -> float:
    """The standard normal's distribution function."""
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _sample(lines: Sequence[EtaLine], most: int) -> list[EtaLine]:
    """At most `most` lines, evenly spaced over the batch (its order kept)."""
    if len(lines) <= most:
        return list(lines)
    step = len(lines) / most
    return [lines[int(i * step)] for i in range(most)]


class _FleetRun:
    """One simulation: the instances' schedulers stepped in emulated time."""

    def __init__(self, fleet: Sequence[EtaInstance], interactive: InteractiveLoad,
                 config: EtaConfig, *, checkpoint: float | None = None) -> None:
        self.models = [member.exec_model for member in fleet]
        self.configs = [replace(member.config, scheduling_policy="priority")
                        for member in fleet]
        self.schedulers = [Scheduler(c) for c in self.configs]
        self.interactive, self.config = interactive, config
        self.rng = random.Random(config.seed)
        self.is_batch: dict[str, bool] = {}
        self.batch_in_flight = 0
        self.batch_done = 0
        self.outputs: list = [None] * len(fleet)
        self.busy = [False] * len(fleet)
        # (time, order, kind, instance): kind _STEP, _ARRIVAL, _ROUND or _JOIN (whose
        # "instance" is the joining line's index).
        self.events: list[tuple[float, int, int, int]] = []
        self.round_due = False  # a _ROUND event is in the heap
        self.order = 0
        # Step-time noise from its own generator: the interactive stream stays the same.
        self.noise_rng = random.Random(config.seed + 1)
        self.at_share, self.checkpoint = checkpoint, None
        self.line_of: dict[str, tuple[int, SeqState]] = {}
        self.num_released = 0
        #: Lines released and on their way to an engine (`dispatch_delay_s`), by index.
        self.joining: dict[int, EtaLine] = {}

    def run(self, lines: list[EtaLine]) -> tuple[float, bool]:
        pending = list(reversed(lines))
        if self.interactive.rate_rps > 0:
            self._push(self.rng.expovariate(self.interactive.rate_rps), _ARRIVAL, -1)
        now = 0.0
        self._release(pending, now)
        while self.batch_done < len(lines):
            if not self.events or now > self.config.max_sim_s:
                return max(now, self.config.max_sim_s), True
            now, _, kind, k = heapq.heappop(self.events)
            if kind == _ARRIVAL:
                self._arrive(now)
                continue
            if kind == _ROUND:
                self.round_due = False
                self._release(pending, now)
                continue
            if kind == _JOIN:
                self._join(now, k, self.joining.pop(k))
                continue
            result = self.schedulers[k].update_from_output(self.outputs[k])
            for rid in result.finished_ids:
                if self.is_batch.pop(rid):
                    self.batch_in_flight -= 1
                    self.batch_done += 1
                    self.line_of.pop(rid, None)
            self._check(now, len(lines))
            self.busy[k] = False
            self._freed(pending, now)
            if not self.busy[k]:  # a released line may have started it already
                self._start(k, now)
        return now, False

    def _check(self, now: float, num_lines: int) -> None:
        """Keep the state once `at_share` of the lines finished (once)."""
        if (self.at_share is None or self.checkpoint is not None
                or self.batch_done < self.at_share * num_lines):
            return
        running = sorted([(index, seq.num_output_tokens) for index, seq in self.line_of.values()]
                         + [(index, 0) for index in self.joining])
        waiting = [(index, 0) for index in range(self.num_released, num_lines)]
        self.checkpoint = Checkpoint(now, tuple(running + waiting))

    def _push(self, at: float, kind: int, instance: int) -> None:
        self.order += 1
        heapq.heappush(self.events, (at, self.order, kind, instance))

    def _arrive(self, now: float) -> None:
        prompt, output = self.rng.choice(self.interactive.shapes)
        self._add(now, prompt, output, batch=False)
        self._push(now + self.rng.expovariate(self.interactive.rate_rps), _ARRIVAL, -1)

    def _freed(self, pending: list[EtaLine], now: float) -> None:
        """After a step: release into the seats its finished lines freed, now (no interval) or
        at the releaser's next round.

        NOTE: a round is scheduled only when a seat is free and a line waits: a round finds
        the window full otherwise, so rounds with nothing to do are never simulated, and none
        once every line is released.
        """
        interval = self.config.release_interval_s
        if interval <= 0:
            self._release(pending, now)
        elif (pending and not self.round_due
              and self.batch_in_flight < self.config.max_in_flight):
            self.round_due = True
            self._push(max(now, math.ceil(now / interval) * interval), _ROUND, -1)

    def _release(self, pending: list[EtaLine], now: float) -> None:
        delay = self.config.dispatch_delay_s
        while pending and self.batch_in_flight < self.config.max_in_flight:
            line, index = pending.pop(), self.num_released
            self.num_released += 1
            self.batch_in_flight += 1
            if delay > 0:
                self.joining[index] = line
                self._push(now + delay, _JOIN, index)
            else:
                self._join(now, index, line)

    def _join(self, now: float, index: int, line: EtaLine) -> None:
        """The released line `index` reaches the instance the router picks now."""
        seq = self._add(now, line.prompt_tokens, line.output_tokens, batch=True)
        self.line_of[seq.request_id] = (index, seq)

    def _add(self, now: float, prompt: int, output: int, *, batch: bool) -> SeqState:
        k = self._place(batch)
        config = self.configs[k]
        prompt = max(1, min(prompt, config.max_model_len - 1))
        output = max(1, min(output, config.max_model_len - prompt))
        rid = f"{'b' if batch else 'i'}{self.order}"
        self.order += 1
        self.is_batch[rid] = batch
        seq = SeqState(rid, prompt, output, priority=engine_priority(
            _BATCH if batch else _INTERACTIVE, now, output, 0.0), arrival_s=now)
        self.schedulers[k].add_request(seq)
        if not self.busy[k]:
            self._start(k, now)
        return seq

    def _place(self, batch: bool) -> int:
        """The instance with the fewest requests ahead of a new one of its class."""
        def ahead(k: int) -> tuple[int, int]:
            sch = self.schedulers[k]
            waiting = sum(1 for s in sch.waiting if batch or not self.is_batch[s.request_id])
            return waiting + len(sch.running), k
        return min(range(len(self.schedulers)), key=ahead)

    def _start(self, k: int, now: float) -> None:
        sch = self.schedulers[k]
        while sch.has_unfinished_requests:
            output = sch.schedule()
            if output.num_scheduled_tokens:
                self.outputs[k], self.busy[k] = output, True
                step_s = self.models[k].step_ms(output.stats) / 1000.0
                if self.config.step_noise:
                    step_s *= self.noise_rng.lognormvariate(0.0, self.config.step_noise)
                self._push(now + step_s, _STEP, k)
                return
            sch.update_from_output(output)  # a priority step that only preempted
