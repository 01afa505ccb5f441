"""Batch completion estimates on the emulated fleet (issue 43's targets): the stack's own
estimate of each batch, stored when the batch is validated and again as it runs, against when
its last line really finished, through the real pipeline beside an interactive stream.

The batches are those of the simulated replay (`benchmarks.batch_eta`): for a terse and a
verbose AlpacaEval model, prompts that ask for short answers, long ones and a mix, twice each
(12 batches), on prompts the length head never saw (the shipped recipe, trained on the other
prompts and cached). Each model is served as itself by two emulated instances of the replay's
kinds (`batch_eta.FLEETS`), and every request, batch line or interactive, generates its model's
real answer length to its prompt (`emulated_output_lengths=answers`, per model).

- Each model's six batches run one after another; the two models' run at once, on their own
  instances (the releaser shares its window between the models' pools by their seats).
- Beside them, each model gets a Poisson interactive stream of its held-out prompts
  (``--rate`` requests a second, emulated), as `/v1/completions` a client waits for.
- The estimate "at validation" is the first one the Batch object shows; "at 25 %" the first
  one made after a quarter of the lines finished (beat repeats them every
  ``--eta-interval`` wall seconds). Error: |estimated - actual| / actual, of the time from the
  estimate to the batch's last line.
- The per-model mean beside it: the service's own estimator, on the same lines, fleet and
  interactive history at validation, with every line's length the model's mean answer over the
  training prompts (computed after the run from the database: the stack serves one head).

It measures time: run it alone (it takes the test services' lock, waits for a quiet machine
and prints the load average at start and end).

Usage::

    python scripts/bench_batch_eta_live.py [--lines 1000] [--time-scale 1.0] [--rate 2.0]
        [--window 192] [--markdown] [--json OUT]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import openai
from sqlalchemy import func, or_, select

from app.cli.stack import LOCAL_TEAM, stop_stacks_on_sigterm
from benchmarks import quiet
from benchmarks.batch_eta import (
    FLEETS,
    MAX_MODEL_LEN,
    TARGETS,
    BatchSpec,
    add_held_out_arguments,
    choose_models,
    held_out_head,
    make_batches,
)
from benchmarks.local import add_service_arguments, bench_stack, fresh_services
from benchmarks.paths import DATA_DIR, ROOT
from benchmarks.quiet import TEST_SERVICES
from benchmarks.tables import print_table
from domain.db import Database
from domain.models import Batch, InferenceRequest
from domain.prompts import PromptCodec
from domain.settings import Settings
from workers.batch import eta
from workers.batch.estimates import (
    dispatch_delay,
    eta_config,
    fleet_of,
    interactive_load,
    window_share,
)
from workers.batch.headroom_window import pool_weights
from workers.predict.dataset import MANY_MODELS, LengthRow, read_many_models, split_by_prompt
from workers.runtime import Runtime
from workers.sim.fleet_declaration import InstanceSpec

__all__ = ["BatchResult", "main"]

#: The local team's cap of held completions (the interactive streams').
HELD_CAP = 1024
#: Scheduler settings of the replay's instances (`batch_eta.fleet_of`).
MAX_NUM_SEQS = 48
MAX_NUM_BATCHED_TOKENS = 512
BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class BatchResult:
    model: str
    name: str
    lines: int
    mean_answer: float
    in_progress_at: float  # epoch s
    last_finished_at: float
    #: (estimated_at, estimated_completion_at) epoch s: at validation and at 25 %.
    at_validation: tuple[float, float] | None
    at_quarter: tuple[float, float] | None
    #: The per-model mean's estimate at validation, seconds from its `estimated_at`.
    mean_estimate_s: float | None

    def error(self, at: str) -> float | None:
        mark = self.at_validation if at == "validation" else self.at_quarter
        if mark is None:
            return None
        actual = self.last_finished_at - mark[0]
        return abs((mark[1] - mark[0]) - actual) / actual

    def mean_error(self) -> float | None:
        if self.mean_estimate_s is None or self.at_validation is None:
            return None
        actual = self.last_finished_at - self.at_validation[0]
        return abs(self.mean_estimate_s - actual) / actual


def answers_file(rows: Sequence[LengthRow], path: Path) -> None:
    """Every held-out answer's length, by model and prompt: what the emulated engines
    generate."""
    with path.open("w") as out:
        for row in rows:
            out.write(json.dumps({"model": row.model, "prompt": row.prompt,
                                  "output_tokens": row.output_tokens}) + "\n")


def fleet(models: Sequence[str], tokenizer: Path) -> tuple[InstanceSpec, ...]:
    """Each model on the replay's instances, served under its own name; prompts are counted
    with `tokenizer`'s model directory."""
    return tuple(InstanceSpec(model=model, count=FLEETS[key][2], engine="emulated",
                              exec_model=FLEETS[key][0], num_blocks=FLEETS[key][1],
                              max_num_seqs=MAX_NUM_SEQS, model_path=tokenizer)
                 for key, model in enumerate(models))


def batch_body(spec: BatchSpec, count: PromptCodec) -> bytes:
    """The batch's lines as `/v1/completions`, each allowed the context its prompt leaves."""
    lines = []
    for i, row in enumerate(spec.rows):
        room = max(1, MAX_MODEL_LEN - count.count(row.prompt))
        lines.append(json.dumps({"custom_id": f"{spec.name}-{i}", "method": "POST",
                                 "url": "/v1/completions",
                                 "body": {"model": spec.model, "prompt": row.prompt,
                                          "max_tokens": room}}))
    return ("\n".join(lines) + "\n").encode()


class InteractiveStream:
    """Poisson `/v1/completions` per model until stopped; counts what failed, by HTTP status
    (0: no answer)."""

    def __init__(self, api_url: str, api_key: str, prompts: dict[str, list[str]],
                 codec: PromptCodec, rate: float, time_scale: float, seed: int) -> None:
        self.url, self.key, self.prompts, self.codec = api_url, api_key, prompts, codec
        self.wall_rate = rate / time_scale
        self.seed = seed
        self.stopped = threading.Event()
        self.sent = 0
        self.failed: Counter[int] = Counter()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(256)
        self._threads = [threading.Thread(target=self._send, args=(model,), daemon=True)
                         for model in prompts]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self.stopped.set()
        for thread in self._threads:
            thread.join()
        self._pool.shutdown(wait=True)

    def _send(self, model: str) -> None:
        rng = random.Random(f"{self.seed}:{model}")
        client = httpx.Client(base_url=self.url, timeout=600,
                              headers={"Authorization": f"Bearer {self.key}"})
        while not self.stopped.wait(rng.expovariate(self.wall_rate)):
            prompt = rng.choice(self.prompts[model])
            room = max(1, MAX_MODEL_LEN - self.codec.count(prompt))
            self._pool.submit(self._one, client, model, prompt, room)

    def _one(self, client: httpx.Client, model: str, prompt: str, room: int) -> None:
        try:
            response = client.post("/v1/completions", json={
                "model": model, "prompt": prompt, "max_tokens": room})
            status = response.status_code
        except httpx.HTTPError:
            status = 0
        with self._lock:
            self.sent += 1
            if status != 200:
                self.failed[status] += 1


def run_batches(client: openai.OpenAI, specs: Sequence[BatchSpec], codec: PromptCodec,
                timeout_s: float) -> list[dict[str, Any]]:
    """One model's batches, one after another; each one's id and the estimates seen."""
    seen = []
    for spec in specs:
        upload = client.files.create(file=(f"{spec.name}.jsonl", io.BytesIO(
            batch_body(spec, codec))), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, completion_window="24h",
                                      endpoint="/v1/completions")
        seen.append({"spec": spec, "id": batch.id, **_follow(client, batch.id, timeout_s)})
        # NOTE: each batch's marks as it ends, so that a run cut short keeps what it measured.
        print(json.dumps({"model": spec.model, "batch": spec.name, "id": batch.id,
                          "at_validation": seen[-1]["at_validation"],
                          "at_quarter": seen[-1]["at_quarter"]}), flush=True)
    return seen


def _follow(client: openai.OpenAI, batch_id: str, timeout_s: float) -> dict[str, Any]:
    """Poll until the batch completes: its first estimate, and the first made after a quarter
    of its lines finished."""
    first = quarter = None
    quarter_at: float | None = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        current = client.batches.retrieve(batch_id).model_dump()
        mark = current.get("blockq") or {}
        made = ((float(mark["estimated_at"]), float(mark["estimated_completion_at"]))
                if mark.get("estimated_completion_at") is not None else None)
        counts = current.get("request_counts") or {}
        if first is None and made is not None:
            first = made
        if quarter_at is None and counts.get("total") and (
                counts["completed"] + counts["failed"] >= 0.25 * counts["total"]):
            quarter_at = time.time()
        if quarter is None and quarter_at is not None and made is not None \
                and made[0] >= math.floor(quarter_at):
            quarter = made
        if current["status"] in ("completed", "failed", "expired", "cancelled"):
            if current["status"] != "completed" or counts.get("failed"):
                raise SystemExit(f"batch {batch_id} ended {current['status']} with "
                                 f"{counts.get('failed')} failed lines")
            return {"at_validation": first, "at_quarter": quarter}
        time.sleep(0.5)
    raise SystemExit(f"batch {batch_id} did not complete within {timeout_s:g} s")


def per_model_mean_s(db: Database, settings: Settings, batch_id: str, model: str,
                     mean_tokens: float, at: float, weights: dict[str, float]) -> float:
    """The service's estimator at validation with the model's mean length for every line: its
    model's share of the window (`weights`: the live pools') beside the models with a batch in
    progress then, the releaser's rounds and the pipeline's delay to the engines."""
    when = datetime.fromtimestamp(at).astimezone()
    with db.session() as session:
        prompts = session.execute(
            select(InferenceRequest.prompt_tokens, InferenceRequest.max_tokens)
            .where(InferenceRequest.batch_id == batch_id)).all()
        interactive = interactive_load(session, when, model)
        delay_s = dispatch_delay(session, when)
        models = {m or "" for m in session.scalars(select(Batch.model).where(
            Batch.in_progress_at <= when,
            or_(Batch.finalizing_at.is_(None), Batch.finalizing_at > when)))}
    lines = [eta.EtaLine(int(p), max(1, min(round(mean_tokens), int(cap or 1))))
             for p, cap in prompts]
    share = window_share(settings.max_batch_in_flight, model, models | {model}, weights)
    answer = eta.estimate(lines, fleet_of(settings, model), interactive,
                          eta_config(settings, share, delay_s))
    return answer.seconds * settings.emulated_time_scale


def _outcome(db: Database, settings: Settings, seen: dict[str, Any],
             mean_tokens: float, weights: dict[str, float]) -> BatchResult:
    spec: BatchSpec = seen["spec"]
    with db.session() as session:
        batch = session.get(Batch, seen["id"])
        started = batch.in_progress_at.timestamp()
        last = session.scalar(select(func.max(InferenceRequest.finished_at))
                              .where(InferenceRequest.batch_id == seen["id"])).timestamp()
    first = seen["at_validation"]
    mean_s = (per_model_mean_s(db, settings, seen["id"], spec.model, mean_tokens, first[0],
                               weights) if first is not None else None)
    return BatchResult(spec.model, spec.name, len(spec.rows),
                       statistics.mean(r.output_tokens for r in spec.rows), started, last,
                       first, seen["at_quarter"], mean_s)


def run(args: argparse.Namespace, data_dir: Path) -> tuple[list[BatchResult], dict[str, int]]:
    rows = read_many_models(args.data / MANY_MODELS)
    train_rows, test_rows = split_by_prompt(rows, test_share=args.test_share, seed=args.seed)
    models = choose_models(rows)
    head_path = args.head or ROOT / ".blockq" / "batch_eta" / f"length_seed{args.seed}_all.npz"
    held_out_head(train_rows, head_path)
    means = {m: statistics.mean(r.output_tokens for r in train_rows if r.model == m)
             for m in models}
    specs = make_batches(test_rows, models, lines=args.lines, seed=args.seed)
    served = [r for r in test_rows if r.model in models]
    answers = data_dir / "answers.jsonl"
    answers_file(served, answers)
    settings = Settings(
        database_url=args.database_url, redis_url=args.redis_url, data_dir=data_dir,
        model_path=args.model_path, engine_kind="emulated", fleet=fleet(models, args.model_path),
        emulated_time_scale=args.time_scale, emulated_output_lengths="answers",
        emulated_answers_path=answers, max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, max_batch_in_flight=args.window,
        batch_eta_interval_s=args.eta_interval, length_model_path=head_path,
        # The head stays the one trained on the other prompts: no retrain on these answers,
        # and the estimator's execution-time models stay the emulated hardware's.
        learn_retrain_interval_s=0.0, learn_refit_interval_s=0.0,
        # The interactive streams hold a completion each for tens of seconds: the default cap
        # of 32 a team refused a fifth of them (429) in the first run.
        held_connections_team_caps={LOCAL_TEAM: HELD_CAP})
    codec = PromptCodec(args.model_path)
    stack = bench_stack(settings)
    db = Database(args.database_url)
    try:
        stack.start()
        stack.wait_ready(num_instances=sum(FLEETS[k][2] for k in range(len(models))),
                         timeout_s=600)
        stream = InteractiveStream(stack.api_url, stack.api_key,
                                   {m: sorted({r.prompt for r in served if r.model == m})
                                    for m in models}, codec, args.rate, args.time_scale,
                                   args.seed)
        stream.start()
        client = openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key=stack.api_key,
                               max_retries=2, timeout=600)
        try:
            with ThreadPoolExecutor(len(models)) as pool:
                runs = list(pool.map(lambda m: run_batches(
                    client, [s for s in specs if s.model == m], codec, args.timeout), models))
        finally:
            stream.stop()
        # NOTE: while the stack runs: its instances' seats are the pools' weights.
        weights = pool_weights(Runtime(settings).fleet)
        results = [_outcome(db, settings, seen, means[seen["spec"].model], weights)
                   for per_model in runs for seen in per_model]
        return results, {"interactive sent": stream.sent,
                         **{f"interactive failed with {status or 'no answer'}": n
                            for status, n in sorted(stream.failed.items())}}
    finally:
        stack.stop()
        db.dispose()


def report(results: Sequence[BatchResult], counts: dict[str, int],
           args: argparse.Namespace) -> None:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    def seconds(mark: tuple[float, float] | None) -> str:
        return "-" if mark is None else f"{mark[1] - mark[0]:.0f}"

    rows = [[r.model, r.name, str(r.lines), f"{r.mean_answer:.0f}",
             f"{r.last_finished_at - r.in_progress_at:.0f}",
             f"{seconds(r.at_validation)} ({pct(r.error('validation'))})",
             "-" if r.mean_estimate_s is None else
             f"{r.mean_estimate_s:.0f} ({pct(r.mean_error())})",
             f"{seconds(r.at_quarter)} ({pct(r.error('25 %'))})"] for r in results]
    print_table(f"batches on the emulated fleet, wall seconds at time scale {args.time_scale:g} "
                "(estimate's error)", ["model", "batch", "lines", "mean answer",
                                       "in progress -> last line", "estimate at validation",
                                       "per-model mean", "estimate at 25 %"],
                rows, markdown=args.markdown)
    summary = []
    for at, target in TARGETS.items():
        errors = [e for r in results if (e := r.error(at)) is not None]
        learned = statistics.median(errors) if errors else None
        mean = (statistics.median(e for r in results if (e := r.mean_error()) is not None)
                if at == "validation" else None)
        summary.append([f"median |error| at {at}", f"{pct(learned)} of {len(errors)}",
                        pct(mean), f"<= {pct(target)}",
                        "yes" if learned is not None and learned <= target else "no"])
    print_table(f"targets over {len(results)} batches", ["figure", "learned head",
                                                         "per-model mean", "target", "met"],
                summary, markdown=args.markdown)
    print("; ".join(f"{k}: {v}" for k, v in counts.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_service_arguments(parser, model_path=True)
    parser.add_argument("--data", type=Path, default=DATA_DIR)
    parser.add_argument("--lines", type=int, default=1000, help="lines a batch")
    parser.add_argument("--rate", type=float, default=2.0,
                        help="interactive requests a second (emulated) on each model")
    parser.add_argument("--window", type=int, default=192,
                        help="max_batch_in_flight (shared by the two models' pools)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="wall seconds per emulated second")
    parser.add_argument("--eta-interval", type=float, default=5.0,
                        help="batch_eta_interval_s: wall seconds between re-estimates")
    add_held_out_arguments(parser)
    parser.add_argument("--timeout", type=float, default=3600.0, help="wall s a batch may take")
    parser.add_argument("--quiet-load", type=float, default=1.5)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    parser.add_argument("--functional-check", action="store_true",
                        help="lock only this run's own services, not the test services: to "
                             "check that it runs beside others (its figures then mean nothing)")
    args = parser.parse_args(argv)
    stop_stacks_on_sigterm()
    own = {"--database-url": args.database_url, "--redis-url": args.redis_url}
    with quiet.alone(math.inf if args.functional_check else args.quiet_load,
                     services=own if args.functional_check else {**TEST_SERVICES, **own},
                     wait_s=0.0 if args.functional_check else 1800.0):
        fresh_services(args.database_url, args.redis_url)
        with tempfile.TemporaryDirectory() as data_dir:
            results, counts = run(args, Path(data_dir))
    report(results, counts, args)
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv),
                                         "results": [asdict(r) for r in results],
                                         "counts": counts}) + "\n")
    return 0
