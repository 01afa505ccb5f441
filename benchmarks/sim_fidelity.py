"""Fidelity of the instance simulator against real vLLM: predicted vs actual TTFT and latency.

Replays Poisson workloads through the real engine (`VllmEngine`: vLLM 0.32 in-process, the tiny
random-weight Llama on CPU) and asks the simulator, for every request at its arrival, "what if
this instance got this request now?" (`workers.sim.predict_what_if`), starting from the
snapshot the engine would have published at that moment (`VllmEngine.snapshot()` taken just
before the submit). Predictions are then compared with what the request actually took.

- Lengths: ShareGPT prompt/answer lengths from
  ``<data>/traces/vidur_opt_scheduler/sharegpt_val_10k_llama2.csv``, halved to fit the tiny
  model's 2048-token context (the trace is for a 4096-token Llama-2). Prompts of exactly that
  many tokens are cut from the demo prompts; output lengths are forced with max_tokens (the
  random model rarely emits EOS; requests that stop early are dropped from the errors).
- Engine: block size 32 (vLLM's CPU minimum), a small KV cache (``--num-blocks``, 80 blocks =
  2560 tokens) so that the busier runs queue and preempt; max_num_seqs 48, 512-token budget.
- Execution-time model: fitted (`fit_from_step_samples`) on the step samples of separate
  calibration runs (other seeds; one at 24 req/s by default, ``--calibration-rate 8 32``
  pools several), never on the runs it predicts. The samples carry the context features
  (decode context, prefill chunk x context, chunk squared) that `VllmEngine` reads from
  vLLM's scheduler; ``--no-context-features`` drops them (the fit before they existed).
  See `StepRecorder` and `reclassify_recompute` for the corrections made to step samples.
  ``--fit-loss time`` fits step times that add up (relative error, the default, runs short
  on the sum; see `fit_from_step_samples`).
- Lengths are given to the simulator exactly (the final output length of every request): this
  measures the simulator and the execution-time model, not the length predictor (the Block
  paper's Block* setting).
- "replay" columns: the whole run simulated with every arrival known, as a diagnostic. A
  what-if cannot know the requests that arrive after its own, which then share its steps;
  the gap between the two is that part of the error. "what-if vs replay" compares the two
  predictions directly: that part alone, free of the machine's speed.
- ``--future-window-s W`` (0: off) adds the expected-future-load term (`FutureLoad`): for
  every request, the arrival rate and mean prompt/output length of the run's requests
  submitted in the W seconds before it (only past arrivals: no future knowledge; output
  lengths are the final ones, as for every request here), which the what-if injects as
  evenly spaced arrivals during the request's lifetime. Analysing one saved measurement
  with and without it (``--load-raw``) compares the two on the same requests.
- Rank agreement: every evaluation run also carries one shared stream of "probe" requests
  (same lengths, same arrival offsets), so each probe ran on two instances with different
  loads (two runs); the simulator "routes" it to the run where it predicts the shorter
  latency, and we check whether it actually finished sooner there. "Regret" is how much
  longer the chosen side took than the better side, relative to the better side.

Usage::

    python scripts/bench_sim_fidelity.py [--model-dir DIR] [--data DIR] [--rates 8 16 24 32]
        [--calibration-rate 24 [R ...]] [--no-context-features] [--fit-loss relative|time]
        [--duration-s 12]
        [--num-blocks 80] [--seed 0]
        [--future-window-s W] [--plot docs/sim_fidelity.png]
        [--save-raw FILE | --load-raw FILE] [--markdown]

Needs the tiny model (``python scripts/build_tiny_model.py``); takes about 75 s. Real-time
measurements on a shared machine move with its other load: run it under ``nice -n -10`` there,
and read the "step-time bias" column (far from 0: the machine ran differently from calibration).
Results and the exact commands: docs/benchmarks_sim.md.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import logging
import random
import statistics
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from benchmarks.paths import DATA_DIR, ROOT, TINY_MODEL
from benchmarks.stats import quantile
from benchmarks.tables import pct, print_table, signed_pct
from workers.serve.engine import EngineListener, GenerationRequest, GenerationResult, StepSample
from workers.sim import (
    BatchStats,
    ExecModel,
    FutureLoad,
    InstanceConfig,
    InstanceSnapshot,
    Scheduler,
    SeqState,
    SimRequest,
    WhatIf,
    estimate_future_load,
    fit_from_step_samples,
    predict_what_if,
)
from workers.sim.engine_state import EngineState
from workers.sim.exec_model import CONTEXT_KEYS, FIT_LOSSES

DEFAULT_DATA_DIR = DATA_DIR
DEFAULT_MODEL_DIR = TINY_MODEL
CORPUS = ROOT / "app" / "demo" / "sample_prompts.jsonl"
TRACE = Path("traces/vidur_opt_scheduler/sharegpt_val_10k_llama2.csv")
#: The trace's context (Llama-2) over the tiny model's: lengths are divided by this.
TRACE_CONTEXT = 4096
MAX_MODEL_LEN = 2048
BLOCK_SIZE = 32  # vLLM's CPU attention takes multiples of 32 only
#: Share of the lowest evaluation rate that is the probe stream shared by all runs.
PROBE_SHARE = 0.5
DEFAULT_RATES = [8.0, 16.0, 24.0, 32.0]
DEFAULT_CALIBRATION_RATES = (24.0,)
#: Label of a calibration run (a prefix: several runs are "calibration <rate> req/s").
CALIBRATION = "calibration"
DEFAULT_DURATION_S = 12.0
DEFAULT_NUM_BLOCKS = 80


# ------------------------------------------------------------------------------ workload


@dataclass(frozen=True, slots=True)
class Arrival:
    request_id: str
    at_s: float  # offset from the start of the run
    num_prompt_tokens: int
    num_output_tokens: int
    is_probe: bool = False


def load_lengths(path: Path, max_model_len: int) -> list[tuple[int, int]]:
    """ShareGPT (prompt, output) lengths scaled from the trace's context to `max_model_len`."""
    scale = max_model_len / TRACE_CONTEXT
    with open(path, newline="") as handle:
        rows = [(int(r["num_prefill_tokens"]), int(r["num_decode_tokens"]))
                for r in csv.DictReader(handle)]
    scaled = [(max(2, round(p * scale)), max(1, round(d * scale))) for p, d in rows]
    return [(p, d) for p, d in scaled if p + d <= max_model_len]


def poisson_stream(rng: random.Random, lengths: Sequence[tuple[int, int]], rate: float,
                   duration_s: float, prefix: str, is_probe: bool = False) -> list[Arrival]:
    """Arrivals at `rate` per second over `duration_s`, lengths drawn from `lengths`."""
    arrivals: list[Arrival] = []
    at_s = rng.expovariate(rate) if rate > 0 else duration_s
    while at_s < duration_s:
        prompt, output = rng.choice(lengths)
        arrivals.append(Arrival(f"{prefix}{len(arrivals)}", at_s, prompt, output, is_probe))
        at_s += rng.expovariate(rate)
    return arrivals


class PromptMaker:
    """Prompt texts of an exact token count (BOS included), cut from real prompts."""

    def __init__(self, model_dir: Path, seed: int) -> None:
        from transformers import AutoTokenizer  # noqa: PLC0415 - heavy, and only here

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        with CORPUS.open(encoding="utf-8") as handle:
            text = "\n".join(json.loads(line)["prompt"] for line in handle)
        self.corpus_ids: list[int] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        self.rng = random.Random(seed)

    def count(self, text: str) -> int:
        return len(self.tokenizer(text)["input_ids"])

    def make(self, num_tokens: int) -> str:
        """A text that tokenizes to exactly `num_tokens` (or the closest found)."""
        width = num_tokens - 1  # BOS
        start = self.rng.randrange(max(1, len(self.corpus_ids) - width - 64))
        text = ""
        for _ in range(8):  # decoding a slice may re-tokenize a little differently: adjust
            text = self.tokenizer.decode(self.corpus_ids[start:start + width])
            error = self.count(text) - num_tokens
            if error == 0:
                break
            width -= error
        return text


# ------------------------------------------------------------------------------ replay


class StepRecorder(EngineListener):
    """Collects the engine's step samples, in the form `fit_from_step_samples` reads.

    NOTE: a sample's duration becomes the engine's iteration period when the engine went
    straight from the previous step into this one (it still had requests): the time since the
    previous step ended. That adds the engine loop's own work between two `step()` calls
    (admitting requests, listener calls, locking: 3-5 % of a step of the tiny model), which
    the requests wait through just the same, and which the simulator's steps must include.

    Each row also gets ``cpu_ms``: the engine thread's CPU time since the previous step
    (`time.thread_time`; `on_step` runs on that thread). The forward pass runs on it (one torch
    thread), so on a machine that other work slows down the wall time stretches and this
    does not: fitted on its own, it tells a step the model under-prices from a stalled one.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.samples: list[dict[str, float]] = []
        self._previous: StepSample | None = None
        self._previous_cpu_s: float | None = None

    def on_step(self, sample: StepSample) -> None:
        row = reclassify_recompute(dataclasses.asdict(sample))
        previous = self._previous
        if previous is not None and previous.num_running + previous.num_waiting > 0:
            row["duration_ms"] = max(row["duration_ms"], (sample.at - previous.at) * 1000.0)
        cpu_s = time.thread_time()
        if self._previous_cpu_s is not None:
            row["cpu_ms"] = (cpu_s - self._previous_cpu_s) * 1000.0
        self._previous_cpu_s = cpu_s
        self._previous = sample
        with self.lock:
            self.samples.append(row)

    def take(self) -> list[dict[str, float]]:
        with self.lock:
            taken, self.samples = self.samples, []
            self._previous = None
            self._previous_cpu_s = None
        return taken


def reclassify_recompute(sample: dict[str, float]) -> dict[str, float]:
    """Move a preempted request's recomputation from decode to prefill tokens.

    NOTE: vLLM counts every scheduled token of a request that already has output as a
    "generation" token, so a resumed request recomputing 400 tokens shows up in
    `StepSample.num_decode_tokens` as 400 decodes. A step with more decode tokens than it
    has sequences left for decodes holds such a chunk: we take it as one recomputing request
    beside one-token decodes in every other sequence. Samples of a `VllmEngine` that reads the
    scheduler (`ScheduleTap`) already count recomputation as prefill: they pass unchanged.
    """
    num_seqs = int(sample["num_seqs"])
    num_decode = int(sample["num_decode_tokens"])
    num_prefill_seqs = 1 if sample["num_prefill_tokens"] else 0
    if num_decode <= num_seqs - num_prefill_seqs:
        return sample
    num_true_decodes = max(0, num_seqs - num_prefill_seqs - 1)
    return {**sample, "num_decode_tokens": num_true_decodes,
            "num_prefill_tokens": sample["num_prefill_tokens"] + num_decode - num_true_decodes}


@dataclass(frozen=True, slots=True)
class Observation:
    """One request of a run: the snapshot at its arrival and what actually happened."""

    run: str
    arrival: Arrival
    snapshot: EngineState
    result: GenerationResult

    @property
    def ttft_s(self) -> float:
        assert self.result.first_token_at is not None
        return self.result.first_token_at - self.result.admitted_at

    @property
    def e2e_s(self) -> float:
        return self.result.finished_at - self.result.admitted_at

    @property
    def complete(self) -> bool:
        """Generated exactly the forced length (did not stop early on EOS)."""
        return self.result.num_output_tokens == self.arrival.num_output_tokens


@dataclass(slots=True)
class Run:
    label: str
    rate: float
    observations: list[Observation]
    samples: list[dict[str, float]]  # step samples, see StepRecorder
    wall_s: float


def replay(engine, recorder: StepRecorder, prompts: PromptMaker, arrivals: list[Arrival],
           label: str, rate: float) -> Run:
    """Submit `arrivals` on time, each right after a snapshot; wait until all finish."""
    texts = {a.request_id: prompts.make(a.num_prompt_tokens) for a in arrivals}
    _wait_idle(engine)
    recorder.take()
    pending: list[tuple[Arrival, EngineState, Future[GenerationResult]]] = []
    started = time.monotonic()
    for arrival in sorted(arrivals, key=lambda a: a.at_s):
        delay = started + arrival.at_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        snapshot = engine.snapshot()
        request = GenerationRequest(f"{label}/{arrival.request_id}", texts[arrival.request_id],
                                    max_tokens=arrival.num_output_tokens,
                                    predicted_output_tokens=arrival.num_output_tokens)
        pending.append((arrival, snapshot, engine.submit(request)))
    observations = [Observation(label, a, s, f.result()) for a, s, f in pending]
    wall_s = time.monotonic() - started
    return Run(label, rate, observations, recorder.take(), wall_s)


def _wait_idle(engine, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while engine.snapshot().requests:
        if time.monotonic() > deadline:
            raise RuntimeError("the engine did not go idle")
        time.sleep(0.05)


# ------------------------------------------------------------------------------ prediction


def instance_snapshot(snapshot: EngineState, prompt_tokens: dict[str, int],
                      final_output_tokens: dict[str, int]) -> InstanceSnapshot:
    """The simulator's view of an engine snapshot, with every request's true final length.

    Requests submitted since the engine's last step show 0 prompt tokens (vLLM has not
    tokenized them yet); their length comes from `prompt_tokens`, as a predictor would read
    it from the request record.
    (`EngineState.to_instance_snapshot` leaves them out: a router does not know their length.)
    """
    config = snapshot.instance_config()
    requests = tuple(
        SimRequest(
            request_id=r.request_id,
            num_prompt_tokens=r.num_prompt_tokens or prompt_tokens[r.request_id],
            num_computed_tokens=r.num_computed_tokens if r.is_running else 0,
            num_output_tokens=r.num_output_tokens,
            predicted_output_tokens=final_output_tokens[r.request_id],
            is_running=r.is_running,
        )
        for r in snapshot.requests
    )
    num_free = min(snapshot.num_free_blocks, config.num_usable_blocks)
    return InstanceSnapshot(config, num_free, requests)


@dataclass(frozen=True, slots=True)
class Prediction:
    """One request: what the simulator predicted, two ways, and what it took."""

    observation: Observation
    #: The what-if at its arrival, from the snapshot (later arrivals unknown).
    whatif: WhatIf
    #: (TTFT, end-to-end) replaying the whole run in the simulator (every arrival known).
    replay_s: tuple[float, float]

    def error(self, metric: str, mode: str = "whatif") -> float:
        """Signed relative error of `metric` ("ttft" or "e2e"): (predicted - actual) / actual;
        mode "vs_replay": the what-if's against the replay's."""
        if mode == "vs_replay":
            replayed = self.replay_s[0 if metric == "ttft" else 1]
            return getattr(self.whatif, f"{metric}_s") / replayed - 1.0
        actual = getattr(self.observation, f"{metric}_s")
        if mode == "whatif":
            predicted = getattr(self.whatif, f"{metric}_s")
        else:
            predicted = self.replay_s[0 if metric == "ttft" else 1]
        return (predicted - actual) / actual


def past_load(run: Run, window_s: float) -> dict[str, FutureLoad]:
    """Each request's expected future load, estimated from the requests submitted before it
    (in the `window_s` seconds before, since the run began)."""
    if window_s <= 0:
        return {}
    ordered = sorted(run.observations, key=lambda o: o.result.admitted_at)
    first = ordered[0]
    began = first.result.admitted_at - first.arrival.at_s
    history = [(o.result.admitted_at, o.result.num_prompt_tokens, o.result.num_output_tokens)
               for o in ordered]
    return {o.result.request_id: estimate_future_load(history[:i], o.result.admitted_at,
                                                      window_s, since=began)
            for i, o in enumerate(ordered)}


def predict_run(run: Run, exec_model: ExecModel, future_window_s: float = 0.0
                ) -> list[Prediction]:
    """Predictions for the complete requests of a run (with the expected-future-load term
    estimated over `future_window_s`, when positive)."""
    prompt_tokens = {o.result.request_id: o.result.num_prompt_tokens for o in run.observations}
    finals = {o.result.request_id: o.result.num_output_tokens for o in run.observations}
    future = past_load(run, future_window_s)
    replayed: dict[str, tuple[float, float]] | None = None
    predictions = []
    for observation in run.observations:
        if not observation.complete:
            continue
        result = observation.result
        snapshot = instance_snapshot(observation.snapshot, prompt_tokens, finals)
        if replayed is None:
            replayed = replay_in_simulator(run, exec_model, snapshot.config)
        new = SimRequest(result.request_id, result.num_prompt_tokens,
                         predicted_output_tokens=result.num_output_tokens)
        what_if = predict_what_if(snapshot, new, exec_model,
                                  future=future.get(result.request_id, FutureLoad()))
        predictions.append(Prediction(observation, what_if, replayed[result.request_id]))
    return predictions


def replay_in_simulator(run: Run, exec_model: ExecModel,
                        config: InstanceConfig) -> dict[str, tuple[float, float]]:
    """(TTFT, end-to-end) of every request, replaying the whole run in the simulator.

    Unlike a what-if, this knows every arrival, including those after a request's own: it
    isolates the scheduler model and the execution-time model from what no predictor can know.
    """
    arrivals = sorted((o.result.admitted_at, o.result) for o in run.observations)
    scheduler = Scheduler(config)
    first_at: dict[str, float] = {}
    timings: dict[str, tuple[float, float]] = {}
    start_at = {r.request_id: at for at, r in arrivals}
    now, index = arrivals[0][0], 0
    while index < len(arrivals) or scheduler.has_unfinished_requests:
        while index < len(arrivals) and arrivals[index][0] <= now:
            result = arrivals[index][1]
            scheduler.add_request(SeqState(result.request_id, result.num_prompt_tokens,
                                           result.num_output_tokens))
            index += 1
        if not scheduler.has_unfinished_requests:
            now = arrivals[index][0]
            continue
        step = scheduler.step()
        now += exec_model.step_ms(step.output.stats) / 1000.0
        for request_id in step.sampled_ids:
            first_at.setdefault(request_id, now)
        for request_id in step.finished_ids:
            began = start_at[request_id]
            timings[request_id] = (first_at[request_id] - began, now - began)
    return timings


# ------------------------------------------------------------------------------ metrics


@dataclass(frozen=True, slots=True)
class ErrorRow:
    """Relative errors |predicted - actual| / actual over a set of requests."""

    label: str
    num_requests: int
    num_dropped: int  # stopped early (EOS): their true length was not the forced one
    #: Sum of the model's step times over the sum of the measured ones, minus 1: how far the
    #: machine ran from what calibration saw (a busy neighbour shows up here first).
    step_time_bias: float
    #: The same on the engine thread's CPU time (model fitted on calibration CPU times): near 0
    #: while the wall-time bias is not means the machine, not the model, made the difference.
    cpu_step_time_bias: float
    num_recomputed_tokens: int
    mean_e2e_s: float
    ttft_median: float
    ttft_p90: float
    e2e_median: float
    e2e_p90: float
    e2e_bias: float  # median signed error
    replay_e2e_median: float
    replay_e2e_p90: float
    replay_e2e_bias: float
    vs_replay_e2e_median: float  # |what-if - replay| / replay: the blind spot alone
    vs_replay_e2e_bias: float


def error_row(label: str, predictions: list[Prediction], runs: Sequence[Run],
              exec_model: ExecModel, cpu_model: ExecModel | None = None) -> ErrorRow:
    def abs_errors(metric: str, mode: str = "whatif") -> list[float]:
        return [abs(p.error(metric, mode)) for p in predictions]

    def bias(mode: str) -> float:
        return statistics.median(p.error("e2e", mode) for p in predictions)

    ttft, e2e, replay_e2e = abs_errors("ttft"), abs_errors("e2e"), abs_errors("e2e", "replay")
    samples = [s for r in runs for s in r.samples]
    modelled_ms = sum(exec_model.step_ms(batch_stats(s)) for s in samples)
    measured_ms = sum(s["duration_ms"] for s in samples)
    return ErrorRow(
        label, len(predictions), sum(not o.complete for r in runs for o in r.observations),
        modelled_ms / measured_ms - 1.0, cpu_bias(cpu_model, samples),
        sum(recomputed_tokens(r) for r in runs),
        statistics.fmean(p.observation.e2e_s for p in predictions),
        quantile(ttft, 0.5), quantile(ttft, 0.9), quantile(e2e, 0.5), quantile(e2e, 0.9),
        bias("whatif"), quantile(replay_e2e, 0.5), quantile(replay_e2e, 0.9), bias("replay"),
        quantile(abs_errors("e2e", "vs_replay"), 0.5), bias("vs_replay"))


def batch_stats(sample: dict[str, float]) -> BatchStats:
    """The batch composition of a step sample (context terms 0 where it lacks them)."""
    num_decodes = int(sample["num_decode_tokens"])
    return BatchStats(num_prefill_tokens=int(sample["num_prefill_tokens"]),
                      num_decode_seqs=num_decodes,
                      num_prefill_seqs=max(int(sample["num_seqs"]) - num_decodes, 0),
                      **{key: int(sample.get(key, 0)) for key in CONTEXT_KEYS})


def cpu_samples(samples: Sequence[dict[str, float]]) -> list[dict[str, float]]:
    """The samples that carry the engine thread's CPU time, with it as their duration."""
    return [{**s, "duration_ms": s["cpu_ms"]} for s in samples if s.get("cpu_ms", 0) > 0]


def cpu_bias(cpu_model: ExecModel | None, samples: Sequence[dict[str, float]]) -> float:
    """Step-time bias on CPU time (NaN without a CPU-time model or samples)."""
    timed = cpu_samples(samples)
    if cpu_model is None or not timed:
        return float("nan")
    modelled = sum(cpu_model.step_ms(batch_stats(s)) for s in timed)
    return modelled / sum(s["duration_ms"] for s in timed) - 1.0


def without_context(run: Run) -> Run:
    """The run with its step samples stripped of the context features."""
    samples = [{k: v for k, v in s.items() if k not in CONTEXT_KEYS} for s in run.samples]
    return dataclasses.replace(run, samples=samples)


def split_calibration(runs: Sequence[Run], rates: Sequence[float]) -> tuple[list[Run], list[Run]]:
    """The calibration runs at `rates` (those the model is fitted on) and the evaluation runs."""
    calibration = [r for r in runs if r.label.startswith(CALIBRATION)]
    chosen = [r for r in calibration if r.rate in rates]
    missing = set(rates) - {r.rate for r in chosen}
    if missing:
        saved = sorted(r.rate for r in calibration)
        raise SystemExit(f"no calibration run at {sorted(missing)} req/s (saved: {saved})")
    return chosen, [r for r in runs if not r.label.startswith(CALIBRATION)]


def fit_calibration(calibration: Sequence[Run], loss: str = "relative") -> ExecModel:
    """The execution-time model fitted on the pooled step samples of the calibration runs."""
    samples = [s for r in calibration for s in r.samples]
    rates = " + ".join(f"{r.rate:g}" for r in calibration)
    return fit_from_step_samples(samples, name="tiny-llama-cpu", loss=loss,
                                 source=f"bench_sim_fidelity calibration runs ({rates} req/s)")


def fit_calibration_cpu(calibration: Sequence[Run], loss: str = "relative") -> ExecModel | None:
    """The same fit on the engine thread's CPU times (None where samples lack them)."""
    samples = cpu_samples([s for r in calibration for s in r.samples])
    return (fit_from_step_samples(samples, name="tiny-llama-cpu-time", loss=loss)
            if samples else None)


def recomputed_tokens(run: Run) -> int:
    """Tokens computed beyond every prompt and output once: what preemptions recomputed."""
    computed = sum(s["num_prefill_tokens"] + s["num_decode_tokens"] for s in run.samples)
    needed = sum(o.result.num_prompt_tokens + o.result.num_output_tokens - 1
                 for o in run.observations)
    return max(0, computed - needed)


@dataclass(frozen=True, slots=True)
class RankRow:
    pair: str
    num_probes: int
    agreement: float
    close_agreement: float  # among probes whose two actual latencies differ by under 25 %
    num_close: int
    mean_regret: float
    p90_regret: float


@dataclass(frozen=True, slots=True)
class Choice:
    """One shared probe routed between two runs by the what-if."""

    right: bool  # the side with the shorter predicted latency actually finished sooner
    close: bool  # its two actual latencies differ by under 25 %
    regret: float  # chosen side's latency over the better side's, minus 1


def choices(left: list[Prediction], right: list[Prediction]) -> list[Choice]:
    """Route each probe both runs share to the run where the what-if says it finishes sooner."""
    by_probe = {p.observation.arrival.request_id: p for p in right
                if p.observation.arrival.is_probe}
    made = []
    for a in left:
        b = by_probe.get(a.observation.arrival.request_id)
        if b is None or not a.observation.arrival.is_probe:
            continue
        actual_a, actual_b = a.observation.e2e_s, b.observation.e2e_s
        chose_a = a.whatif.e2e_s <= b.whatif.e2e_s
        chosen = actual_a if chose_a else actual_b
        made.append(Choice(chose_a == (actual_a <= actual_b),
                           max(actual_a, actual_b) < 1.25 * min(actual_a, actual_b),
                           chosen / min(actual_a, actual_b) - 1.0))
    return made


def rank_row(label: str, made: list[Choice]) -> RankRow:
    close = [c.right for c in made if c.close]
    regrets = [c.regret for c in made]
    return RankRow(label, len(made), statistics.fmean(c.right for c in made),
                   statistics.fmean(close) if close else float("nan"), len(close),
                   statistics.fmean(regrets), quantile(regrets, 0.9))


# ------------------------------------------------------------------------------ output


def print_tables(fit: ExecModel, calibration: Sequence[Run], error_rows: list[ErrorRow],
                 rank_rows: list[RankRow], markdown: bool) -> None:
    error_headers = ("run", "requests", "dropped", "step-time bias", "CPU step-time bias",
                     "recomputed tokens",
                     "mean e2e s",
                     "TTFT median", "TTFT p90", "e2e median", "e2e p90", "e2e bias",
                     "replay e2e median", "replay e2e p90", "replay e2e bias",
                     "what-if vs replay e2e median", "what-if vs replay e2e bias")
    error_cells = [(r.label, str(r.num_requests), str(r.num_dropped),
                    signed_pct(r.step_time_bias), signed_pct(r.cpu_step_time_bias),
                    str(r.num_recomputed_tokens),
                    f"{r.mean_e2e_s:.2f}", pct(r.ttft_median), pct(r.ttft_p90),
                    pct(r.e2e_median), pct(r.e2e_p90),
                    signed_pct(r.e2e_bias), pct(r.replay_e2e_median), pct(r.replay_e2e_p90),
                    signed_pct(r.replay_e2e_bias), pct(r.vs_replay_e2e_median),
                    signed_pct(r.vs_replay_e2e_bias))
                   for r in error_rows]
    rank_headers = ("runs", "probes", "agreement", "close calls", "agreement (close)",
                    "mean regret", "p90 regret")
    rank_cells = [(r.pair, str(r.num_probes), pct(r.agreement), str(r.num_close),
                   pct(r.close_agreement), pct(r.mean_regret), pct(r.p90_regret))
                  for r in rank_rows]
    metrics = fit.metrics
    rates = " + ".join(f"{r.rate:g}" for r in calibration)
    used = [k for k in CONTEXT_KEYS if fit.coefficients_ms.get(k, 0.0) != 0.0]
    print(f"execution-time model fitted on the calibration runs "
          f"({rates} req/s, {sum(len(r.samples) for r in calibration)} steps; context "
          f"features: {', '.join(used) or 'none'}): held-out MAPE "
          f"{metrics.get('mape_holdout', float('nan')):.3f}, "
          f"R^2 {metrics.get('r2_holdout', float('nan')):.3f}")
    print_table("Per-request error |predicted - actual| / actual (what-if at arrival; replay: "
                "whole run simulated)", error_headers, error_cells, markdown=markdown, width=160)
    print_table("Choosing between two instances (shared probes, what-if e2e)", rank_headers,
                rank_cells, markdown=markdown, width=160)


def plot(predictions: dict[str, list[Prediction]], path: Path) -> None:
    """Predicted (what-if) vs actual TTFT and end-to-end latency, one colour per run."""
    import matplotlib  # noqa: PLC0415 - only when plotting

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure, axes = plt.subplots(1, 2, figsize=(11, 5))
    for axis, metric in zip(axes, ("ttft", "e2e"), strict=True):
        low, high = float("inf"), 0.0
        for label, rows in predictions.items():
            actual = [getattr(p.observation, f"{metric}_s") for p in rows]
            predicted = [getattr(p.whatif, f"{metric}_s") for p in rows]
            axis.scatter(actual, predicted, s=8, alpha=0.5, label=label)
            low = min(low, *actual, *predicted)
            high = max(high, *actual, *predicted)
        axis.plot([low, high], [low, high], color="black", linewidth=0.8, label="exact")
        for factor in (0.9, 1.1):
            axis.plot([low, high], [low * factor, high * factor], color="grey",
                      linewidth=0.6, linestyle="--")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel(f"actual {metric.upper()} (s)")
        axis.set_ylabel(f"predicted {metric.upper()} (s)")
        axis.set_title(f"{metric.upper()}: what-if vs real vLLM (dashed: ±10 %)")
        axis.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


# ------------------------------------------------------------------------------ raw data


def save_runs(path: Path, runs: Sequence[Run]) -> None:
    """Everything measured, to re-analyse later without vLLM (`--load-raw`)."""
    data = [{"label": r.label, "rate": r.rate, "wall_s": r.wall_s, "samples": r.samples,
             "observations": [{"arrival": dataclasses.asdict(o.arrival),
                               "snapshot": o.snapshot.to_json(),
                               "result": dataclasses.asdict(o.result)}
                              for o in r.observations]}
            for r in runs]
    path.write_text(json.dumps(data))


def load_runs(path: Path) -> list[Run]:
    runs = []
    for r in json.loads(path.read_text()):
        observations = []
        for o in r["observations"]:
            observations.append(Observation(r["label"], Arrival(**o["arrival"]),
                                            EngineState.from_json(o["snapshot"]),
                                            GenerationResult(**o["result"])))
        runs.append(Run(r["label"], r["rate"], observations, r["samples"], r["wall_s"]))
    return runs


# ------------------------------------------------------------------------------ main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR,
                        help="the tiny model (scripts/build_tiny_model.py builds it)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR,
                        help="shared data directory (default: ../shared/data)")
    parser.add_argument("--rates", type=float, nargs="+", default=DEFAULT_RATES,
                        help="arrival rates (requests/s) of the evaluation runs")
    parser.add_argument("--duration-s", type=float, default=DEFAULT_DURATION_S,
                        help="arrival window of each run (a run lasts until all finish)")
    parser.add_argument("--calibration-rate", type=float, nargs="+",
                        default=list(DEFAULT_CALIBRATION_RATES),
                        help="arrival rates of the calibration runs the execution-time model "
                             "is fitted on (pooled); with --load-raw, which saved ones to use")
    parser.add_argument("--no-context-features", action="store_true",
                        help="fit without the step samples' context features")
    parser.add_argument("--fit-loss", choices=FIT_LOSSES, default="relative",
                        help="execution-time model fit: relative squared error (the old "
                             "table), or 'time': step times that add up, stalls left out")
    parser.add_argument("--num-blocks", type=int, default=DEFAULT_NUM_BLOCKS,
                        help="KV-cache blocks of the engine (small: forces preemption)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the engine")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "sim_fidelity.png",
                        help="where to write the scatter plot")
    parser.add_argument("--save-raw", type=Path, help="write every measurement here (JSON)")
    parser.add_argument("--load-raw", type=Path,
                        help="analyse measurements saved by --save-raw instead of running vLLM")
    parser.add_argument("--future-window-s", type=float, default=0.0,
                        help="expected-future-load term: estimate each request's arrival rate "
                             "and mean shape over this many seconds before it (0: off)")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    return parser.parse_args()


def build_engine(args: argparse.Namespace, recorder: StepRecorder):
    from workers.serve.vllm_engine import VllmEngine, VllmEngineConfig  # noqa: PLC0415 - heavy

    config = VllmEngineConfig(
        model=str(args.model_dir), max_num_seqs=48, max_num_batched_tokens=512,
        max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE, kv_cache_gib=0.25,
        num_blocks_override=args.num_blocks, num_threads=args.threads, seed=args.seed,
    )
    engine = VllmEngine(config, recorder)
    engine.start()
    return engine


def measure(args: argparse.Namespace) -> list[Run]:
    """The calibration run, then one run per rate; all on one engine."""
    lengths = load_lengths(args.data / TRACE, MAX_MODEL_LEN)
    rng = random.Random(args.seed)
    prompts = PromptMaker(args.model_dir, args.seed)
    recorder = StepRecorder()
    engine = build_engine(args, recorder)
    try:
        runs = []
        several = len(args.calibration_rate) > 1
        for index, rate in enumerate(args.calibration_rate):
            # NOTE: the first keeps the seed a single calibration run always had.
            calibration = poisson_stream(random.Random(args.seed + 1000 + index), lengths,
                                         rate, args.duration_s, f"c{index or ''}")
            label = f"{CALIBRATION} {rate:g} req/s" if several else CALIBRATION
            runs.append(replay(engine, recorder, prompts, calibration, label, rate))
        probe_rate = PROBE_SHARE * min(args.rates)
        probes = poisson_stream(rng, lengths, probe_rate, args.duration_s, "p", is_probe=True)
        for rate in args.rates:
            background = poisson_stream(rng, lengths, rate - probe_rate, args.duration_s, "b")
            runs.append(replay(engine, recorder, prompts, probes + background,
                               f"{rate:g} req/s", rate))
        for run in runs:
            print(f"{run.label}: {len(run.observations)} requests in {run.wall_s:.0f} s")
    finally:
        engine.stop()
    return runs


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING)
    started = time.monotonic()
    runs = load_runs(args.load_raw) if args.load_raw else measure(args)
    if args.save_raw:
        save_runs(args.save_raw, runs)
    if args.no_context_features:
        runs = [without_context(run) for run in runs]
    calibration, runs = split_calibration(runs, args.calibration_rate)
    exec_model = fit_calibration(calibration, args.fit_loss)
    predictions = {run.label: predict_run(run, exec_model, args.future_window_s)
                   for run in runs}
    cpu_model = fit_calibration_cpu(calibration, args.fit_loss)
    error_rows = [error_row(run.label, predictions[run.label], [run], exec_model, cpu_model)
                  for run in runs]
    error_rows.append(error_row("all", [p for ps in predictions.values() for p in ps], runs,
                                exec_model, cpu_model))
    pairs = {f"{a.label} vs {b.label}": choices(predictions[a.label], predictions[b.label])
             for i, a in enumerate(runs) for b in runs[i + 1:]}
    pairs = {label: made for label, made in pairs.items() if made}
    rank_rows = [rank_row(label, made) for label, made in pairs.items()]
    if pairs:
        rank_rows.append(rank_row("all pairs", [c for made in pairs.values() for c in made]))
    if args.future_window_s > 0:
        print(f"what-if with expected future load: arrival rate and mean shape over the "
              f"{args.future_window_s:g} s before each request")
    print_tables(exec_model, calibration, error_rows, rank_rows, args.markdown)
    plot(predictions, args.plot)
    print(f"plot written to {args.plot}; {time.monotonic() - started:.0f} s in all")
