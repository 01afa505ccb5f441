"""Online learning, measured in the running stack: a length model trained on one answer model
serves another; the loop retrains it from the request history and promotes it.

Emulated instances answer real prompts with the lengths of the served model's real answers
(../shared/data/conversations). The run, in one stack:

  A  history   prompts P1, initial model           -> the history the retrain learns from
  B  before    prompts P2, initial model           -> error and TTFT before (history rows of B
                                                      are removed: the retrain never sees P2)
  -  retrain   `learn.retrain_length` on the learn queue; promoted only if it beats the initial
               model on the newest history slice; predictor workers hot-reload it
  C  after     prompts P2 again, same arrival times, promoted model -> error and TTFT after

    .venv/bin/python scripts/bench_online_learning.py --instances 4 --rate 12 --time-scale 0.5
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from app.cli.stack import stop_stacks_on_sigterm
from benchmarks.local import add_service_arguments, bench_stack, fresh_services
from benchmarks.paths import TINY_MODEL
from domain.celery_app import create_celery
from domain.db import Database
from domain.dispatch import QUEUE_LEARN, TASK_RETRAIN_LENGTH
from domain.models import InferenceRequest, ModelVersion, RequestOutcome
from domain.prompts import PromptCodec
from domain.settings import Settings
from workers.predict.dataset import (
    DEFAULT_DATA_DIR,
    LengthRow,
    build_rows,
    write_rows,
)
from workers.predict.length_model import train

console = Console(width=180)
MODEL_PATH = TINY_MODEL


@dataclass(frozen=True)
class Phase:
    name: str
    ids: list[str]


def _split_prompts(rows: Sequence[LengthRow], served: str, max_prompt_tokens: int,
                   seed: int) -> tuple[list[LengthRow], list[LengthRow]]:
    """The served model's answers to prompts that fit the context, split in two halves."""
    codec = PromptCodec(MODEL_PATH)
    fitting = [r for r in rows if r.model == served and codec.count(r.prompt) <= max_prompt_tokens]
    random.Random(seed).shuffle(fitting)
    half = len(fitting) // 2
    return fitting[:half], fitting[half:]


def _send(client: httpx.Client, rows: Sequence[LengthRow], rate: float, seed: int,
          max_tokens: int) -> list[str]:
    """Poisson arrivals (the same for the same seed); waits until every request is terminal."""
    rng = random.Random(seed)
    ids = []
    with client:
        next_at = time.monotonic()
        for row in rows:
            next_at += rng.expovariate(rate)
            time.sleep(max(0.0, next_at - time.monotonic()))
            response = client.post("/v1/requests",
                                   json={"prompt": row.prompt, "max_tokens": max_tokens})
            response.raise_for_status()
            ids.append(response.json()["id"])
        pending, deadline = set(ids), time.monotonic() + 900
        while pending and time.monotonic() < deadline:
            pending = {i for i in pending if client.get(f"/v1/requests/{i}").json()["status"]
                       not in {"succeeded", "failed", "cancelled"}}
            time.sleep(0.5)
    return ids


def _phase_metrics(db: Database, phase: Phase) -> dict[str, float | str]:
    with db.session() as session:
        rows = session.scalars(sa.select(InferenceRequest)
                               .where(InferenceRequest.id.in_(phase.ids))).all()
    done = [r for r in rows if r.status == "succeeded"]
    predicted = np.array([r.predicted_output_tokens for r in done], dtype=float)
    actual = np.array([r.output_tokens for r in done], dtype=float)
    relative = np.abs(predicted - actual) / np.maximum(actual, 1)
    ttft = np.array([(r.first_token_at - r.created_at).total_seconds() for r in done])
    e2e = np.array([(r.finished_at - r.created_at).total_seconds() for r in done])
    fallback = sum(1 for r in done if (r.routing or {}).get("fallback"))
    predictors = sorted({r.predictor for r in done if r.predictor})
    return {
        "phase": phase.name, "requests": f"{len(done)}/{len(phase.ids)}",
        "predictor": ", ".join(p.removeprefix("length_model:") for p in predictors),
        "mae": float(np.abs(predicted - actual).mean()),
        "median_rel": float(np.median(relative)),
        "within_25": float((relative <= 0.25).mean()),
        "miss_share": float((relative > 0.5).mean()),
        "ttft_p50": float(np.percentile(ttft, 50)), "ttft_p99": float(np.percentile(ttft, 99)),
        "e2e_p99": float(np.percentile(e2e, 99)),
        "fallback_share": fallback / max(len(done), 1),
    }


def _forget_history(db: Database, ids: Sequence[str]) -> None:
    with db.session() as session:
        session.execute(sa.delete(RequestOutcome).where(RequestOutcome.request_id.in_(ids)))


def _retrain(settings: Settings, db: Database, timeout_s: float = 600) -> ModelVersion:
    """Send the retrain task to the stack's learn queue and wait for the version it registers."""
    celery = create_celery(settings)
    celery.send_task(TASK_RETRAIN_LENGTH, kwargs={"reason": "benchmark"}, queue=QUEUE_LEARN)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with db.session() as session:
            row = session.scalar(sa.select(ModelVersion).where(ModelVersion.kind == "length"))
            if row is not None:
                return row
        time.sleep(1.0)
    raise TimeoutError("the retrain registered no version")


def _print(results: list[dict], title: str) -> None:
    table = Table(title=title)
    columns = [("phase", "phase"), ("requests", "requests"), ("predictor", "predictor"),
               ("mae", "MAE (tokens)"), ("median_rel", "median rel. error"),
               ("within_25", "within 25%"), ("miss_share", "> 50% off"),
               ("ttft_p50", "TTFT p50 (s)"), ("ttft_p99", "TTFT p99 (s)"),
               ("e2e_p99", "e2e p99 (s)"), ("fallback_share", "routed in fallback")]
    for _, label in columns:
        table.add_column(label, justify="right")
    for result in results:
        table.add_row(*(f"{result[k]:.3f}" if isinstance(result[k], float) else str(result[k])
                        for k, _ in columns))
    console.print(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--initial-model", default="gpt-3.5-turbo-0125",
                        help="answer model the initial length model is trained on")
    parser.add_argument("--served-model", default="gpt-4-0314",
                        help="answer model whose real answer lengths the instances replay")
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--rate", type=float, default=12.0, help="requests per second")
    parser.add_argument("--time-scale", type=float, default=0.5)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--max-prompt-tokens", type=int, default=1536)
    parser.add_argument("--seed", type=int, default=0)
    add_service_arguments(parser)
    parser.add_argument("--json", type=Path, help="write the results to this file")
    args = parser.parse_args()
    stop_stacks_on_sigterm()

    rows = build_rows(args.data)
    first, second = _split_prompts(rows, args.served_model, args.max_prompt_tokens, args.seed)
    initial_rows = [r for r in rows if r.model == args.initial_model]
    console.print(f"initial model: {len(initial_rows)} answers of {args.initial_model}; served: "
                  f"{args.served_model}, {len(first)} + {len(second)} prompts")
    fresh_services(args.database_url, args.redis_url)
    with tempfile.TemporaryDirectory() as data_dir:
        initial, _ = train(initial_rows)
        artifact = initial.head.save(Path(data_dir) / "initial.npz")
        bootstrap = Path(data_dir) / "bootstrap_rows.jsonl"
        write_rows(bootstrap, initial_rows)  # what the initial model knew, kept for retrains
        answers = Path(data_dir) / "answers.jsonl"
        answers.write_text("".join(json.dumps({"prompt": r.prompt,
                                               "output_tokens": r.output_tokens}) + "\n"
                                   for r in rows if r.model == args.served_model))
        settings = Settings(
            database_url=args.database_url, redis_url=args.redis_url, data_dir=Path(data_dir),
            model_path=MODEL_PATH, api_port=8792, flower_port=5592, num_instances=args.instances,
            engine_kind="emulated", emulated_time_scale=args.time_scale,
            emulated_exec_model="llama-2-7b-a30", emulated_num_blocks=1052,
            emulated_output_lengths="answers", emulated_answers_path=answers,
            routing_policy="block", length_model_path=artifact,
            length_fast_model_path=artifact,  # its retrained versions on the hot path too
            max_model_len=4096,
            learn_retrain_interval_s=0, learn_refit_interval_s=0, learn_min_rows=50,
            length_bootstrap_rows=bootstrap,
            model_reload_interval_s=1.0,
        )
        stack = bench_stack(settings)
        db = Database(args.database_url)
        try:
            stack.start()
            stack.wait_ready(num_instances=args.instances, timeout_s=300)
            send = lambda prompts: _send(stack.client(timeout=60), prompts, args.rate,  # noqa: E731
                                         args.seed, args.max_tokens)
            history = Phase("A history (P1, initial model)", send(first))
            before = Phase("B before (P2, initial model)", send(second))
            _forget_history(db, before.ids)
            started = time.monotonic()
            version = _retrain(settings, db)
            retrain_s = time.monotonic() - started
            time.sleep(2 * settings.model_reload_interval_s)
            after = Phase("C after (P2, retrained model)", send(second))
            results = [_phase_metrics(db, p) for p in (history, before, after)]
        finally:
            stack.stop()
            db.dispose()
    _print(results, f"Online learning: {args.instances} emulated instances, block routing, "
                    f"{args.rate}/s, initial {args.initial_model} -> served {args.served_model}")
    holdout = version.metrics
    console.print(f"retrain: version {version.version} {version.status} in {retrain_s:.1f} s "
                  f"({version.training_rows} training rows); newest-history slice of "
                  f"{holdout['holdout_rows']}: candidate MAE "
                  f"{holdout['candidate']['mae_tokens']:.1f} vs active "
                  f"{holdout['active']['mae_tokens']:.1f}")
    if args.json:
        args.json.write_text(json.dumps({"phases": results, "retrain": {
            "version": version.version, "status": version.status, "seconds": retrain_s,
            "metrics": holdout}}, indent=2))
    return 0
