"""Interactive latency while a bulk batch runs, against the same traffic with no batch, in one run.

Starts the local stack with emulated instances, then sends the same Poisson stream of
interactive chat completions twice (the same prompts and arrival times): once alone, once while
a 2,000-line batch (Batch API, priority `batch`) is in progress. Prints interactive TTFT and
end-to-end p50/p99 for both phases, and the batch's progress.

    .venv/bin/python scripts/bench_batch_interference.py --instances 4 --rate 4 --duration 60
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import redis
import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.cli.demo import load_sample_prompts  # noqa: E402
from app.cli.stack import Stack  # noqa: E402
from app.db import Database  # noqa: E402
from app.migrate import recreate_database, upgrade  # noqa: E402
from app.models import InferenceRequest  # noqa: E402
from app.settings import Settings  # noqa: E402

console = Console(width=160)


def _interactive(client: openai.OpenAI, model: str, prompts: list[dict], rate: float,
                 duration_s: float, seed: int) -> list[str]:
    """Poisson arrivals for `duration_s`; returns the request ids (from the response ids)."""
    rng = random.Random(seed)
    ids: list[str] = []
    lock = threading.Lock()

    def one(row: dict) -> None:
        response = client.chat.completions.create(
            model=model, max_tokens=row["max_tokens"],
            messages=[{"role": "user", "content": row["prompt"]}])
        with lock:
            ids.append("req_" + response.id.removeprefix("chatcmpl-"))

    with ThreadPoolExecutor(64) as pool:
        started = time.monotonic()
        next_at, i = started, 0
        while True:
            next_at += rng.expovariate(rate)
            if next_at - started > duration_s:
                break
            time.sleep(max(0.0, next_at - time.monotonic()))
            pool.submit(one, prompts[i % len(prompts)])
            i += 1
    return ids


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
    done = [r for r in rows if r.first_token_at and r.finished_at]
    ttft = np.array([(r.first_token_at - r.created_at).total_seconds() for r in done])
    e2e = np.array([(r.finished_at - r.created_at).total_seconds() for r in done])
    return {"requests": len(done), "ttft_p50": float(np.percentile(ttft, 50)),
            "ttft_p99": float(np.percentile(ttft, 99)), "e2e_p50": float(np.percentile(e2e, 50)),
            "e2e_p99": float(np.percentile(e2e, 99))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--rate", type=float, default=4.0, help="interactive requests/s")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per phase")
    parser.add_argument("--batch-lines", type=int, default=2000)
    parser.add_argument("--time-scale", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--database-url",
                        default="postgresql+psycopg://postgres@127.0.0.1:5432/blockq_bench")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--json", type=Path, help="write the results to this file")
    args = parser.parse_args()

    recreate_database(args.database_url)
    upgrade(args.database_url)
    redis.Redis.from_url(args.redis_url).flushdb()
    prompts = load_sample_prompts()
    with tempfile.TemporaryDirectory() as data_dir:
        settings = Settings(
            database_url=args.database_url, redis_url=args.redis_url, data_dir=Path(data_dir),
            model_path=ROOT / ".blockq" / "models" / "tiny-llama", api_port=8793,
            flower_port=5593, num_instances=args.instances, engine_kind="emulated",
            emulated_time_scale=args.time_scale, routing_policy="block", engine_concurrency=96,
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKQ_")}
        stack = Stack(settings, env={**env, **settings.as_env()})
        db = Database(args.database_url)
        try:
            stack.start()
            stack.wait_ready(num_instances=args.instances, timeout_s=300)
            client = openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key=stack.api_key,
                                   max_retries=0, timeout=600)
            model = settings.model_name
            alone = _interactive(client, model, prompts, args.rate, args.duration, args.seed)
            time.sleep(5)
            upload = client.files.create(
                file=("bulk.jsonl", io.BytesIO(_batch_file(prompts, model, args.batch_lines))),
                purpose="batch")
            batch = client.batches.create(input_file_id=upload.id, completion_window="24h",
                                          endpoint="/v1/chat/completions")
            time.sleep(5)  # let the batch fill the instances first
            beside = _interactive(client, model, prompts, args.rate, args.duration, args.seed)
            progress = client.batches.retrieve(batch.id)
            results = {"alone": _latencies(db, alone), "with_batch": _latencies(db, beside),
                       "batch": {"status": progress.status,
                                 "completed": progress.request_counts.completed
                                 if progress.request_counts else None,
                                 "total": args.batch_lines}}
            client.batches.cancel(batch.id)
        finally:
            stack.stop()
            db.dispose()
    _print(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _print(results: dict, args: argparse.Namespace) -> None:
    table = Table(title=f"Interactive chat completions at {args.rate}/s for {args.duration:g} s, "
                        f"{args.instances} emulated instances, block routing")
    for column in ("phase", "requests", "TTFT p50 (s)", "TTFT p99 (s)", "e2e p50 (s)",
                   "e2e p99 (s)"):
        table.add_column(column, justify="right")
    for name, label in (("alone", "no batch"), ("with_batch", f"{args.batch_lines}-line batch "
                                                               "running")):
        r = results[name]
        table.add_row(label, str(r["requests"]), f"{r['ttft_p50']:.3f}", f"{r['ttft_p99']:.3f}",
                      f"{r['e2e_p50']:.3f}", f"{r['e2e_p99']:.3f}")
    console.print(table)
    batch = results["batch"]
    console.print(f"batch at the end of the second phase: {batch['status']}, "
                  f"{batch['completed']}/{batch['total']} lines done")


if __name__ == "__main__":
    raise SystemExit(main())
