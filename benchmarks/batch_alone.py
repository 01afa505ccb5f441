"""A batch alone on an idle emulated fleet: its lines a second against the rate the simulator
gives for the same lines on the same fleet (issue 43: 90 % or more), and the stack's own
completion estimate at validation against when the batch really finished.

Starts the local stack with emulated instances (no interactive traffic), submits one batch of
``--lines`` completions (the sample prompts, output lengths drawn from ShareGPT's by the
emulated engine, capped by ``--max-tokens``), and waits for it to complete. Then:

- measured: lines / (last line finished - batch in progress), in wall seconds;
- the simulator's saturated rate: `workers.batch.eta.saturated_lines_per_s` on the lines' own
  prompt and output tokens as the stack recorded them, on the configured fleet
  (`workers.batch.estimates.fleet_of`), the releaser's window in flight, converted to wall
  seconds by the emulated time scale;
- the estimate the stack stored when it validated the batch (the Batch object's "blockq"
  field) against the batch's actual completion.

It answers whether a batch alone reaches the fleet's limit, or whether the control plane (the
releaser's pace, the predict and route stages) holds it back. It measures time: run it alone
(it takes the test services' lock and prints the load average at start and end).

Usage::

    python scripts/bench_batch_alone.py [--instances 3] [--lines 2000] [--time-scale 0.1]
        [--max-tokens 512] [--window 256]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import openai
from sqlalchemy import func, select

from app.cli.demo import load_sample_prompts
from benchmarks import services_lock
from benchmarks.local import add_service_arguments, bench_stack, fresh_services
from benchmarks.tables import print_table
from domain.db import Database
from domain.models import Batch, InferenceRequest
from domain.settings import Settings
from workers.batch.estimates import fleet_of
from workers.batch.eta import EtaConfig, EtaLine, saturated_lines_per_s

__all__ = ["main"]

#: The services every default test run locks: a measurement takes them too, to run alone.
TEST_SERVICES = {
    "BLOCKQ_TEST_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:5432/blockq_test",
    "BLOCKQ_TEST_REDIS_URL": "redis://127.0.0.1:6379/15",
}


def batch_file(model: str, lines: int, max_tokens: int) -> bytes:
    prompts = load_sample_prompts()
    rows = [json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions",
                        "body": {"model": model, "max_tokens": max_tokens,
                                 "prompt": prompts[i % len(prompts)]["prompt"]}})
            for i in range(lines)]
    return ("\n".join(rows) + "\n").encode()


def run(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    settings = Settings(
        database_url=args.database_url, redis_url=args.redis_url, data_dir=data_dir,
        model_path=args.model_path, num_instances=args.instances, engine_kind="emulated",
        emulated_time_scale=args.time_scale, emulated_exec_model=args.exec_model,
        max_batch_in_flight=args.window, batch_eta_interval_s=args.eta_interval)
    stack = bench_stack(settings)
    db = Database(args.database_url)
    try:
        stack.start()
        stack.wait_ready(num_instances=args.instances, timeout_s=300)
        client = openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key=stack.api_key,
                               max_retries=0, timeout=600)
        upload = client.files.create(file=("alone.jsonl", io.BytesIO(batch_file(
            settings.model_name, args.lines, args.max_tokens))), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, completion_window="24h",
                                      endpoint="/v1/completions")
        first_estimate = _wait(client, batch.id, args.timeout)
        return _measure(db, settings, batch.id, first_estimate, args)
    finally:
        stack.stop()
        db.dispose()


def _wait(client: openai.OpenAI, batch_id: str, timeout_s: float) -> dict[str, Any] | None:
    """Poll until the batch ends; the first completion estimate seen."""
    first = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        current = client.batches.retrieve(batch_id).model_dump()
        estimate = current.get("blockq") or {}
        if first is None and estimate.get("estimated_completion_at") is not None:
            first = estimate
        if current["status"] in ("completed", "failed", "expired", "cancelled"):
            if current["status"] != "completed":
                raise SystemExit(f"batch {batch_id} ended {current['status']}")
            return first
        time.sleep(1.0)
    raise SystemExit(f"batch {batch_id} did not complete within {timeout_s:g} s")


def _measure(db: Database, settings: Settings, batch_id: str,
             first_estimate: dict[str, Any] | None, args: argparse.Namespace) -> dict[str, Any]:
    with db.session() as session:
        batch = session.get(Batch, batch_id)
        started = batch.in_progress_at
        rows = session.execute(select(InferenceRequest.prompt_tokens,
                                      InferenceRequest.output_tokens)
                               .where(InferenceRequest.batch_id == batch_id)).all()
        last = session.scalar(select(func.max(InferenceRequest.finished_at))
                              .where(InferenceRequest.batch_id == batch_id))
        model = batch.model
    wall_s = (last - started).total_seconds()
    lines = [EtaLine(int(p), max(1, int(o or 1))) for p, o in rows]
    simulated = saturated_lines_per_s(lines, fleet_of(settings, model), EtaConfig(
        max_in_flight=args.window, max_lines=len(lines))) / args.time_scale
    result = {"lines": len(lines), "wall_s": wall_s, "lines_per_s": len(lines) / wall_s,
              "saturated_lines_per_s": simulated,
              "mean_output_tokens": sum(line.output_tokens for line in lines) / len(lines)}
    if first_estimate is not None:
        estimated_s = first_estimate["estimated_completion_at"] - first_estimate["estimated_at"]
        actual_s = last.timestamp() - first_estimate["estimated_at"]
        result.update(estimated_s=estimated_s, actual_s=actual_s,
                      estimate_error=abs(estimated_s - actual_s) / actual_s)
    return result


def report(result: dict[str, Any], args: argparse.Namespace) -> None:
    ratio = result["lines_per_s"] / result["saturated_lines_per_s"]
    rows = [["lines", str(result["lines"])],
            ["mean output tokens", f"{result['mean_output_tokens']:.0f}"],
            ["fleet", f"{args.instances} x emulated {args.exec_model}, time scale "
                      f"{args.time_scale:g}, {args.window} lines in flight at most"],
            ["measured: in progress -> last line", f"{result['wall_s']:.1f} s"],
            ["measured lines/s", f"{result['lines_per_s']:.2f}"],
            ["simulator's saturated lines/s (same lines, same fleet)",
             f"{result['saturated_lines_per_s']:.2f}"],
            ["measured / saturated (target >= 90 %)",
             f"{100 * ratio:.1f} % ({'met' if ratio >= 0.9 else 'not met'})"]]
    if "estimated_s" in result:
        rows += [["estimate at validation: seconds to the last line",
                  f"{result['estimated_s']:.0f} (actual {result['actual_s']:.0f}, error "
                  f"{100 * result['estimate_error']:.1f} %)"]]
    else:
        rows += [["estimate at validation", "none seen (the bulk predictor made none)"]]
    print_table("a batch alone on an idle emulated fleet", ["figure", "value"], rows,
                markdown=args.markdown)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_service_arguments(parser, model_path=True)
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--time-scale", type=float, default=0.1,
                        help="wall seconds per emulated second")
    parser.add_argument("--exec-model", default="qwen2-7b-a30")
    parser.add_argument("--window", type=int, default=256,
                        help="max_batch_in_flight: batch lines in flight at most")
    parser.add_argument("--eta-interval", type=float, default=10.0,
                        help="batch_eta_interval_s of the stack")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--functional-check", action="store_true",
                        help="lock only this run's own services, not the test services: to "
                             "check that it runs beside others (its timings then mean nothing)")
    args = parser.parse_args(argv)
    print(f"load average at start: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}",
          flush=True)
    urls = {"--database-url": args.database_url, "--redis-url": args.redis_url}
    try:
        lock = services_lock.hold(urls if args.functional_check else {**TEST_SERVICES, **urls})
    except services_lock.ServicesBusy as busy:
        parser.exit(2, f"error: {busy}\n")
    with lock:
        fresh_services(args.database_url, args.redis_url)
        with tempfile.TemporaryDirectory() as data_dir:
            result = run(args, Path(data_dir))
    report(result, args)
    print(f"load average at end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0
