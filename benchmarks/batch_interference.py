"""Interactive latency while a bulk batch runs, against the same traffic with no batch, in one run.

Starts the local stack with emulated instances, then sends the same Poisson stream of
interactive chat completions twice (the same prompts and arrival times): once alone, once while
a 10,000-line batch (Batch API, priority `batch`) is in progress. Prints interactive TTFT and
end-to-end p50/p99 for both phases, and the batch's progress.

    .venv/bin/python scripts/bench_batch_interference.py --instances 4 --rate 4 --duration 60

Each configuration (`--headroom-ttft`: 0 is the fixed `max_batch_in_flight`, a target in
seconds steers the batch window by interactive TTFT, workers/batch/headroom.py) gets its own
stack and three phases: interactive alone, the batch alone (its output tokens/s: the fleet's
capacity for it), both. The batch's share of free capacity is its output tokens/s beside the
interactive stream over (capacity - the interactive stream's output tokens/s alone).
`--interactive-seats` and `--batch-prefill-last` turn on the engines' own rules
(engine_interactive_seats, engine_batch_prefill_last) in every configuration.

With `--simulated` there is no stack: the engines alone (workers.sim.Scheduler) in emulated
time, with engine modes fcfs, class (class first), hold (class first and the seat reserve) and
yield (hold and batch prefills last), and batch windows fixed or the slot bound.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import openai
import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from app.cli.demo import load_sample_prompts
from app.cli.stack import stop_stacks_on_sigterm
from benchmarks.live.stats import StepRecord, engine_stall
from benchmarks.local import add_service_arguments, bench_stack, fresh_services
from benchmarks.paths import TINY_MODEL
from domain.db import Database
from domain.models import EngineStepSample, InferenceRequest
from domain.prompts import PromptCodec
from domain.settings import Settings
from workers.batch.headroom import slot_bound
from workers.serve.output_lengths import sharegpt_output_tokens
from workers.sim import (
    InstanceConfig,
    Scheduler,
    SeqState,
    bundled_model,
    engine_priority,
)

console = Console(width=160)


@dataclass
class _Sent:
    """What one stream sent: the ids of the answered requests and the errors of the others."""

    ids: list[str]
    errors: list[str]


def _interactive(client: openai.OpenAI, model: str, prompts: list[dict], rate: float,
                 duration_s: float, seed: int) -> _Sent:
    """Poisson arrivals for `duration_s`; the request ids (from the response ids), and what
    each failed request raised (a failed request is not measured: it is reported)."""
    rng = random.Random(seed)
    sent = _Sent([], [])
    lock = threading.Lock()

    def one(row: dict) -> None:
        try:
            response = client.chat.completions.create(
                model=model, max_tokens=row["max_tokens"],
                messages=[{"role": "user", "content": row["prompt"]}])
        except openai.OpenAIError as exc:
            with lock:
                sent.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            return
        with lock:
            sent.ids.append("req_" + response.id.removeprefix("chatcmpl-"))

    with ThreadPoolExecutor(HELD_CONNECTIONS) as pool:
        started = time.monotonic()
        next_at, i = started, 0
        while True:
            next_at += rng.expovariate(rate)
            if next_at - started > duration_s:
                break
            time.sleep(max(0.0, next_at - time.monotonic()))
            pool.submit(one, prompts[i % len(prompts)])
            i += 1
    return sent


def _batch_file(prompts: list[dict], model: str, lines: int) -> bytes:
    rows = []
    for i in range(lines):
        row = prompts[i % len(prompts)]
        rows.append(json.dumps({
            "custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "max_tokens": row["max_tokens"],
                     "messages": [{"role": "user", "content": row["prompt"]}]}}))
    return ("\n".join(rows) + "\n").encode()


def _latencies(db: Database, ids: list[str]) -> dict[str, float]:
    with db.session() as session:
        rows = session.scalars(sa.select(InferenceRequest)
                               .where(InferenceRequest.id.in_(ids))).all()
    done = [r for r in rows if r.first_token_at and r.finished_at and r.started_at]
    ttft = np.array([(r.first_token_at - r.created_at).total_seconds() for r in done])
    e2e = np.array([(r.finished_at - r.created_at).total_seconds() for r in done])
    # Where a TTFT went: the control plane and the broker (accept -> the engine worker takes
    # it), then the engine (its queue for a seat, the prefill): the engines' rules act on the
    # second only.
    to_engine = np.array([(r.started_at - r.created_at).total_seconds() for r in done])
    in_engine = ttft - to_engine
    return {"requests": len(done), "ttft_p50": float(np.percentile(ttft, 50)),
            "ttft_p99": float(np.percentile(ttft, 99)), "e2e_p50": float(np.percentile(e2e, 50)),
            "e2e_p99": float(np.percentile(e2e, 99)),
            "to_engine_p99": float(np.percentile(to_engine, 99)),
            "in_engine_p99": float(np.percentile(in_engine, 99)),
            "ttft_s": ttft.round(4).tolist(), "to_engine_s": to_engine.round(4).tolist()}


def _tokens_per_s(db: Database, *, batch: bool, since: float, until: float) -> float:
    """Output tokens per second of the batch's (or the interactive) requests that finished in
    [since, until] (epoch seconds)."""
    start = datetime.fromtimestamp(since, UTC)
    end = datetime.fromtimestamp(until, UTC)
    kind = (InferenceRequest.batch_id.is_not(None) if batch
            else InferenceRequest.batch_id.is_(None))
    with db.session() as session:
        tokens = session.scalar(
            sa.select(sa.func.coalesce(sa.func.sum(InferenceRequest.output_tokens), 0))
            .where(kind, InferenceRequest.status == "succeeded",
                   InferenceRequest.finished_at >= start, InferenceRequest.finished_at <= end))
    return float(tokens) / (until - since)


def _engine_stall(db: Database, *, since: float, until: float) -> dict[str, float | None]:
    """How far the emulated engines ran behind their own clocks in [since, until] (epoch s):
    the share of their busy wall time in which they had work and did not step, and the worst
    such gap (`benchmarks.live.stats.engine_stall`)."""
    start = datetime.fromtimestamp(since, UTC)
    end = datetime.fromtimestamp(until, UTC)
    sample = EngineStepSample
    with db.session() as session:
        rows = session.execute(
            sa.select(sample.instance_id, sample.at, sample.duration_ms, sample.num_running,
                      sample.num_waiting)
            .where(sample.at >= start, sample.at <= end)
            .order_by(sample.instance_id, sample.at)).all()
    by_instance: dict[str, list[StepRecord]] = {}
    for row in rows:
        by_instance.setdefault(row.instance_id, []).append(StepRecord(
            row.at.timestamp(), row.duration_ms / 1000.0, row.num_running + row.num_waiting > 0))
    stalls = [engine_stall(steps) for steps in by_instance.values()]
    busy = sum(s.busy_s for s in stalls)
    return {"engine_stall_share": sum(s.stalled_s for s in stalls) / busy if busy else None,
            "engine_worst_gap_s": max((s.worst_gap_s for s in stalls), default=None)}


def _wait_in_progress(client: openai.OpenAI, batch_id: str, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while client.batches.retrieve(batch_id).status != "in_progress":
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} not in progress after {timeout_s:.0f} s")
        time.sleep(1.0)


def _interactive_phase(client: openai.OpenAI, db: Database, model: str, prompts: list[dict],
                       args: argparse.Namespace) -> dict[str, Any]:
    started = time.time()
    sent = _interactive(client, model, prompts, args.rate, args.duration, args.seed)
    ended = time.time()
    if sent.errors:
        console.print(f"[red]{len(sent.errors)} of {len(sent.errors) + len(sent.ids)} "
                      f"requests failed[/red], first: {sent.errors[0]}")
    return {**_latencies(db, sent.ids), "failed": len(sent.errors),
            "interactive_tokens_s": _tokens_per_s(db, batch=False, since=started, until=ended),
            "batch_tokens_s": _tokens_per_s(db, batch=True, since=started, until=ended),
            **_engine_stall(db, since=started, until=ended)}


#: Context length with --sharegpt-lengths (the Block paper's setting, as in --simulated).
SHAREGPT_MAX_MODEL_LEN = 4096
#: Their max_tokens: above every ShareGPT answer length (1,734 at most), and beside the longest
#: prompt (2,048 tokens) and its chat template within the context.
SHAREGPT_MAX_TOKENS = SHAREGPT_MAX_MODEL_LEN - 2048 - 64
#: Interactive requests open at once that the client and the stack take (its 2 API workers).
HELD_CONNECTIONS = 320


def sharegpt_shaped(prompts: list[dict], prompt_lengths: list[int]) -> list[dict]:
    """The sample prompts stretched (row i to about `prompt_lengths[i]` tokens of the served
    tokenizer, by repeating its text), each with a max_tokens that leaves the emulated
    engine's ShareGPT output draw uncut."""
    codec = PromptCodec(TINY_MODEL)
    shaped = []
    for i, row in enumerate(prompts):
        target = prompt_lengths[i % len(prompt_lengths)]
        unit = row["prompt"].strip() + " "
        chars_per_token = len(unit) / max(len(codec.token_ids(unit)), 1)
        text = (unit * (int(target * chars_per_token / len(unit)) + 1))[
            : int(target * chars_per_token)]
        shaped.append({**row, "prompt": text, "max_tokens": SHAREGPT_MAX_TOKENS})
    return shaped


def draw_prompt_tokens(source: random.Random) -> int:
    """A prompt length of the --simulated and --sharegpt-lengths streams: lognormal, median
    150 tokens (ShareGPT-like), capped at 2,048."""
    return min(2048, max(4, round(source.lognormvariate(math.log(150), 1.0))))


def _prompts(args: argparse.Namespace) -> list[dict]:
    prompts = load_sample_prompts()
    if not args.sharegpt_lengths:
        return prompts
    source = random.Random(args.seed)
    return sharegpt_shaped(prompts, [draw_prompt_tokens(source) for _ in prompts])


def run_config(args: argparse.Namespace, headroom_ttft_s: float) -> dict[str, Any]:
    """One stack: interactive alone, then the batch alone (the fleet's capacity for it), then
    both; the batch's throughput beside interactive traffic against the capacity it leaves."""
    fresh_services(args.database_url, args.redis_url)
    prompts = _prompts(args)
    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(
            database_url=args.database_url, redis_url=args.redis_url, data_dir=Path(data_dir),
            model_path=TINY_MODEL, api_port=args.api_port,
            flower_port=args.flower_port, num_instances=args.instances, engine_kind="emulated",
            emulated_time_scale=args.time_scale, routing_policy="block",
            max_batch_in_flight=args.max_batch_in_flight, batch_headroom_ttft_s=headroom_ttft_s,
            engine_interactive_seats=args.interactive_seats,
            engine_batch_prefill_last=args.batch_prefill_last,
            **({"max_model_len": SHAREGPT_MAX_MODEL_LEN} if args.sharegpt_lengths else {}),
            # NOTE: every interactive request holds its connection until it ends (tens of
            # seconds with ShareGPT lengths): room for the whole stream, so that no tenant cap
            # (429) or thread limit (503) decides which requests are measured.
            held_connections_per_team=HELD_CONNECTIONS,
        )
        stack = bench_stack(settings)
        db = Database(args.database_url)
        try:
            stack.start()
            stack.wait_ready(num_instances=args.instances, timeout_s=300)
            client = openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key=stack.api_key,
                                   max_retries=0, timeout=600)
            model = settings.model_name
            if args.interactive_warmup > 0:  # first requests pay cold starts (model loads)
                console.print(f"[bold]headroom target {headroom_ttft_s:g} s[/bold]: warm-up")
                _interactive(client, model, prompts, args.rate, args.interactive_warmup,
                             args.seed + 1)
            console.print(f"[bold]headroom target {headroom_ttft_s:g} s[/bold]: interactive alone")
            alone = _interactive_phase(client, db, model, prompts, args)
            time.sleep(5)
            upload = client.files.create(
                file=("bulk.jsonl", io.BytesIO(_batch_file(prompts, model, args.batch_lines))),
                purpose="batch")
            batch = client.batches.create(input_file_id=upload.id, completion_window="24h",
                                          endpoint="/v1/chat/completions")
            _wait_in_progress(client, batch.id)
            console.print("batch alone")
            time.sleep(args.warmup)  # the window opens, the instances fill
            since = time.time()
            time.sleep(args.duration)
            capacity = _tokens_per_s(db, batch=True, since=since, until=time.time())
            console.print("interactive beside the batch")
            beside = _interactive_phase(client, db, model, prompts, args)
            progress = client.batches.retrieve(batch.id)
            client.batches.cancel(batch.id)
        finally:
            stack.stop()
            db.dispose()
    free = capacity - alone["interactive_tokens_s"]
    return {"headroom_ttft_s": headroom_ttft_s, "alone": alone, "with_batch": beside,
            "batch": {"status": progress.status, "total": args.batch_lines,
                      "completed": (progress.request_counts.completed
                                    if progress.request_counts else None),
                      "capacity_tokens_s": capacity, "free_tokens_s": free,
                      "share_of_free": beside["batch_tokens_s"] / free if free > 0 else None}}


# ---------------------------------------------------------------- --simulated: engines only

#: Engine modes that keep seats for interactive requests.
HOLDS = ("hold", "yield")


@dataclass
class _SimRequest:
    seq: SeqState
    is_batch: bool
    arrival_s: float
    instance: int
    first_token_s: float | None = None
    finished_s: float | None = None


def _simulate(args: argparse.Namespace, *, engine: str, window: str, interactive: bool,
              batch: bool) -> dict[str, Any]:
    """One phase on `--instances` simulated engines in emulated time (no control plane): a
    Poisson interactive stream and/or a batch backlog released every second through `window`
    ("fixed": `--max-batch-in-flight`; "bound": the engine slots less the interactive
    reserve, workers.batch.headroom.slot_bound). `engine`: "fcfs" (plain FCFS, the emulated
    engine before class-first priorities) or "class" (interactive first, vLLM's priority
    policy) or "hold" (class first, and `--sim-seats` of each engine's seats kept for
    interactive requests: a batch request is admitted only while fewer than max_num_seqs -
    sim_seats requests run, InstanceConfig.num_interactive_seats) or "yield" (hold, and batch
    prefills after every other running request, sitting a step out while an interactive request
    waits: InstanceConfig.batch_prefill_last). Each request goes to the instance with the fewest
    requests ahead of it."""
    config = InstanceConfig(num_total_blocks=args.sim_blocks, block_size=16,
                            max_num_seqs=args.sim_max_num_seqs, max_num_batched_tokens=512,
                            max_model_len=4096, priority_ms_per_token=0.0,
                            scheduling_policy="fcfs" if engine == "fcfs" else "priority",
                            num_interactive_seats=args.sim_seats if engine in HOLDS else 0,
                            batch_prefill_last=engine == "yield")
    model = bundled_model("qwen2-7b-a30")
    # NOTE: the interactive stream (arrivals and lengths) draws from its own generator, so that
    # every phase and configuration sees the same requests (the p99 of two different samples
    # of this heavy-tailed stream differs by 10 % or more on its own); the batch from another.
    rng = random.Random(args.seed)
    batch_rng = random.Random(args.seed + 1)
    schedulers = [Scheduler(config) for _ in range(args.instances)]
    step_end: list[float | None] = [None] * args.instances
    outputs: list[Any] = [None] * args.instances
    requests: dict[str, _SimRequest] = {}
    horizon = args.sim_warmup + args.sim_duration
    arrivals: list[float] = []
    t = 0.0
    while interactive:
        t += rng.expovariate(args.sim_rate)
        if t > horizon:
            break
        arrivals.append(t)
    batch_tokens = interactive_tokens = 0
    next_release = 0.0 if batch else math.inf
    num_batch = 0

    def lengths(source: random.Random) -> tuple[int, int]:
        prompt = draw_prompt_tokens(source)
        return prompt, min(4096 - prompt, sharegpt_output_tokens(source.random() * 100.0))

    interactive_lengths = [lengths(rng) for _ in arrivals]

    def add(now: float, is_batch: bool, shape: tuple[int, int] | None = None) -> None:
        prompt, output = shape if shape is not None else lengths(batch_rng)
        rid = f"{'b' if is_batch else 'i'}{len(requests)}"
        # What block's what-if sees: whether the new request finds a slot at once, then how
        # many requests run or wait ahead of it (FCFS: all; class order: the interactive ones).
        ahead = [sum(1 for s in sch.waiting
                     if engine == "fcfs" or is_batch or not requests[s.request_id].is_batch)
                 for sch in schedulers]
        seats = config.max_num_seqs - (config.num_interactive_seats if is_batch else 0)
        k = min(range(args.instances), key=lambda i: (
            len(schedulers[i].running) + ahead[i] >= seats, ahead[i],
            len(schedulers[i].running), i))
        seq = SeqState(rid, prompt, output, priority=engine_priority(int(is_batch), now, output,
                                                                     0.0), arrival_s=now)
        requests[rid] = _SimRequest(seq, is_batch, now, k)
        schedulers[k].add_request(seq)
        if step_end[k] is None:
            start(k, now)

    def start(k: int, now: float) -> None:
        sch = schedulers[k]
        while sch.has_unfinished_requests:
            output = sch.schedule()
            if output.num_scheduled_tokens:
                outputs[k], step_end[k] = output, now + model.step_ms(output.stats) / 1000.0
                return
            sch.update_from_output(output)  # a priority step that only preempted
        step_end[k] = None

    def occupancy(now: float) -> float:
        busy = sum(min(r.finished_s, now) - max(r.arrival_s, now - 30.0)
                   for r in requests.values() if not r.is_batch and r.finished_s is not None
                   and r.finished_s > now - 30.0)
        return busy / min(30.0, max(now, 1.0))

    arrival_index = 0
    while True:
        ends = [(e, k) for k, e in enumerate(step_end) if e is not None]
        next_step = min(ends) if ends else (math.inf, -1)
        next_arrival = arrivals[arrival_index] if arrival_index < len(arrivals) else math.inf
        now = min(next_step[0], next_arrival, next_release)
        if now > horizon:
            break
        if now == next_arrival:
            add(now, False, interactive_lengths[arrival_index])
            arrival_index += 1
        elif now == next_release:
            in_flight = sum(1 for r in requests.values() if r.is_batch and r.finished_s is None)
            allowed = args.max_batch_in_flight
            if window == "bound":
                allowed = min(allowed, slot_bound(args.instances * config.max_num_seqs,
                                                  occupancy(now), args.sim_margin))
            for _ in range(max(0, allowed - in_flight)):
                add(now, True)
                num_batch += 1
            next_release = now + 1.0
        else:
            k = next_step[1]
            result = schedulers[k].update_from_output(outputs[k])
            for rid in result.sampled_ids:
                r = requests[rid]
                if r.first_token_s is None:
                    r.first_token_s = now
                if now >= args.sim_warmup:
                    if r.is_batch:
                        batch_tokens += 1
                    else:
                        interactive_tokens += 1
            for rid in result.finished_ids:
                requests[rid].finished_s = now
            start(k, now)
    measured = [r for r in requests.values() if not r.is_batch and r.arrival_s >= args.sim_warmup
                and r.first_token_s is not None]
    ttft = np.array([r.first_token_s - r.arrival_s for r in measured]) if measured else None
    return {"requests": len(measured),
            "ttft_p50": float(np.percentile(ttft, 50)) if ttft is not None else None,
            "ttft_p99": float(np.percentile(ttft, 99)) if ttft is not None else None,
            "interactive_tokens_s": interactive_tokens / args.sim_duration,
            "batch_tokens_s": batch_tokens / args.sim_duration,
            "preemptions": sum(s.num_preemptions for s in schedulers)}


def run_simulated(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each (engine, window) configuration's three phases, in emulated time."""
    results = []
    for engine, window in (c.split("/") for c in args.sim_configs):
        alone = _simulate(args, engine=engine, window=window, interactive=True, batch=False)
        # The fleet's capacity for the batch: every seat (the reserve is for interactive work).
        capacity = _simulate(args, engine="class" if engine in HOLDS else engine,
                             window=window, interactive=False, batch=True)["batch_tokens_s"]
        beside = _simulate(args, engine=engine, window=window, interactive=True, batch=True)
        free = capacity - alone["interactive_tokens_s"]
        results.append({"engine": engine, "window": window, "alone": alone, "with_batch": beside,
                        "capacity_tokens_s": capacity, "free_tokens_s": free,
                        "share_of_free": beside["batch_tokens_s"] / free if free > 0 else None})
    table = Table(title=f"Simulated engines only (no control plane): {args.instances} instances "
                        f"x max_num_seqs {args.sim_max_num_seqs}, Qwen2-7B/A30, interactive "
                        f"{args.sim_rate:g} req/s for {args.sim_duration:g} s, slot bound "
                        f"margin {args.sim_margin:g} sigma, hold {args.sim_seats} seats, "
                        f"seed {args.seed}")
    for column in ("engine order", "batch window", "TTFT p99 alone (s)",
                   "TTFT p99 beside (s)", "ratio", "batch share of free capacity",
                   "preemptions"):
        table.add_column(column, justify="right")
    for r in results:
        a, b = r["alone"], r["with_batch"]
        table.add_row(r["engine"], "fixed " + str(args.max_batch_in_flight)
                      if r["window"] == "fixed" else "slot bound",
                      f"{a['ttft_p99']:.3f}", f"{b['ttft_p99']:.3f}",
                      f"{b['ttft_p99'] / a['ttft_p99']:.2f}x",
                      "-" if r["share_of_free"] is None else f"{r['share_of_free']:.0%}",
                      str(b["preemptions"]))
    console.print(table)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--rate", type=float, default=4.0, help="interactive requests/s")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per phase")
    parser.add_argument("--warmup", type=float, default=15.0,
                        help="seconds of batch before its capacity is measured")
    parser.add_argument("--interactive-warmup", type=float, default=15.0,
                        help="seconds of the interactive stream sent, and not measured, before "
                             "the first phase (the stack's cold starts: the first requests load "
                             "models and fill caches)")
    parser.add_argument("--batch-lines", type=int, default=10_000)
    parser.add_argument("--max-batch-in-flight", type=int, default=256)
    parser.add_argument("--headroom-ttft", type=float, nargs="+", default=[0.0, 1.0],
                        help="batch_headroom_ttft_s of each configuration, in order (0: the "
                             "fixed max_batch_in_flight)")
    parser.add_argument("--time-scale", type=float, default=0.5)
    parser.add_argument("--interactive-seats", type=int, default=0,
                        help="engine_interactive_seats of the stack's engines")
    parser.add_argument("--batch-prefill-last", action="store_true",
                        help="engine_batch_prefill_last on the stack's engines")
    parser.add_argument("--sharegpt-lengths", action="store_true",
                        help="the --simulated setting live: the sample prompts stretched to "
                             "its prompt lengths, ShareGPT output lengths (the emulated "
                             "engine's draw, uncut) and a 4096-token context")
    parser.add_argument("--seed", type=int, default=0)
    add_service_arguments(parser)
    parser.add_argument("--api-port", type=int, default=8793)
    parser.add_argument("--flower-port", type=int, default=5593)
    parser.add_argument("--json", type=Path, help="write the results to this file")
    parser.add_argument("--simulated", action="store_true",
                        help="no stack: the engines alone (workers.sim.Scheduler) in emulated "
                             "time: engine modes (--sim-configs) and batch windows")
    parser.add_argument("--sim-rate", type=float, default=8.0, help="interactive req/s")
    parser.add_argument("--sim-duration", type=float, default=600.0)
    parser.add_argument("--sim-warmup", type=float, default=60.0)
    parser.add_argument("--sim-max-num-seqs", type=int, default=48)
    parser.add_argument("--sim-blocks", type=int, default=7289)
    parser.add_argument("--sim-configs", nargs="+",
                        default=["fcfs/fixed", "class/fixed", "class/bound"],
                        help="engine order (fcfs|class|hold: class and the seat reserve|yield: "
                             "hold and batch prefills last) / batch window (fixed|bound) pairs")
    parser.add_argument("--sim-seats", type=int, default=4,
                        help="hold: seats of each engine kept for interactive requests "
                             "(engine_interactive_seats)")
    parser.add_argument("--sim-margin", type=float, default=2.0,
                        help="the slot bound's margin in Poisson sigmas "
                             "(batch_headroom_slot_margin)")
    args = parser.parse_args()
    stop_stacks_on_sigterm()
    if args.simulated:
        results = run_simulated(args)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return 0
    results = [run_config(args, target) for target in args.headroom_ttft]
    _print(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _print(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    table = Table(title=f"Interactive chat completions at {args.rate}/s for {args.duration:g} s "
                        f"beside a {args.batch_lines}-line batch, {args.instances} emulated "
                        f"instances (time scale {args.time_scale:g}), block routing")
    for column in ("batch window", "phase", "requests", "TTFT p50 (s)", "TTFT p99 (s)",
                   "e2e p50 (s)", "e2e p99 (s)", "accept->engine p99 (s)",
                   "engine->first token p99 (s)", "engine stalled", "worst stall (s)",
                   "TTFT p99 vs alone", "batch tokens/s",
                   "batch share of free capacity"):
        table.add_column(column, justify="right")
    for r in results:
        window = (f"headroom {r['headroom_ttft_s']:g} s" if r["headroom_ttft_s"]
                  else f"fixed {args.max_batch_in_flight}")
        for name, label in (("alone", "no batch"), ("with_batch", "batch running")):
            p = r[name]
            ratio = p["ttft_p99"] / r["alone"]["ttft_p99"]
            share = r["batch"]["share_of_free"] if name == "with_batch" else None
            failed = f" ({p['failed']} failed)" if p.get("failed") else ""
            table.add_row(window, label, f"{p['requests']}{failed}", f"{p['ttft_p50']:.3f}",
                          f"{p['ttft_p99']:.3f}", f"{p['e2e_p50']:.3f}", f"{p['e2e_p99']:.3f}",
                          f"{p['to_engine_p99']:.3f}", f"{p['in_engine_p99']:.3f}",
                          _share(p["engine_stall_share"]), _seconds(p["engine_worst_gap_s"]),
                          f"{ratio:.2f}x", f"{p['batch_tokens_s']:.0f}",
                          _share(share))
    console.print(table)
    console.print("engine stalled: the share of the engines' busy wall time in which they had "
                  "work and did not step (the CPU or the interpreter lock held them): time the "
                  "emulated GPU lost, that a GPU would not")
    for r in results:
        b = r["batch"]
        console.print(f"headroom {r['headroom_ttft_s']:g}: batch alone "
                      f"{b['capacity_tokens_s']:.0f} output tokens/s (the fleet's capacity "
                      f"for it); free beside the "
                      f"interactive stream {b['free_tokens_s']:.0f}; at the end {b['status']}, "
                      f"{b['completed']}/{b['total']} lines done")


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
