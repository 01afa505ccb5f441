"""Decision overhead of the real pipeline: time from entering predict to the publish on gpu.<k>.

Starts the local stack with N emulated instances (default 12, full fan-out: the block policy
simulates every instance for every request), sends a Poisson stream of requests through the API,
and prints the median and p99 of the overhead and of the routing decision itself, from the
decisions recorded with the requests.

    .venv/bin/python scripts/bench_decision_overhead.py --instances 12 --requests 400 --rate 20
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from app.cli.demo import load_sample_prompts
from app.cli.stack import stop_stacks_on_sigterm
from benchmarks import quiet
from benchmarks.local import add_service_arguments, bench_stack, fresh_services
from benchmarks.paths import TINY_MODEL
from domain.settings import Settings


def _send(client: httpx.Client, num_requests: int, rate: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    prompts = load_sample_prompts()
    ids = []
    with client:
        next_at = time.monotonic()
        for i in range(num_requests):
            next_at += rng.expovariate(rate)
            time.sleep(max(0.0, next_at - time.monotonic()))
            row = prompts[i % len(prompts)]
            body = {"prompt": row["prompt"], "max_tokens": row["max_tokens"]}
            ids.append(client.post("/v1/requests", json=body).json()["id"])
        deadline = time.monotonic() + 300
        pending = set(ids)
        while pending and time.monotonic() < deadline:
            pending = {i for i in pending
                       if client.get(f"/v1/requests/{i}").json()["status"]
                       not in {"succeeded", "failed", "cancelled"}}
            time.sleep(0.5)
    return ids


def _routing_records(database_url: str) -> list[dict]:  # type: ignore[type-arg]
    engine = sa.create_engine(database_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT routing FROM requests WHERE routing IS NOT NULL"))
        records = [row[0] for row in rows]
    engine.dispose()
    return records


def _stage(records: list[dict], name: str) -> list[float]:  # type: ignore[type-arg]
    return [r["stages_ms"][name] for r in records if "stages_ms" in r]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=12)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second")
    parser.add_argument("--policy", default="block")
    parser.add_argument("--length-predictor", default="learned", choices=["learned", "baseline"])
    parser.add_argument("--time-scale", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    add_service_arguments(parser)
    args = parser.parse_args()
    with quiet.alone():  # measured alone, on a quiet machine
        stop_stacks_on_sigterm()

        fresh_services(args.database_url, args.redis_url)
        with tempfile.TemporaryDirectory() as data_dir:
            settings = Settings(
                database_url=args.database_url, redis_url=args.redis_url, data_dir=Path(data_dir),
                model_path=TINY_MODEL, api_port=8791, flower_port=5591,
                num_instances=args.instances, engine_kind="emulated",
                emulated_time_scale=args.time_scale, routing_policy=args.policy,
                length_predictor=args.length_predictor,
            )
            stack = bench_stack(settings)
            try:
                stack.start()
                stack.wait_ready(num_instances=args.instances, timeout_s=300)
                _send(stack.client(), args.requests, args.rate, args.seed)
            finally:
                stack.stop()
        records = _routing_records(args.database_url)
        table = Table(title=f"Decision overhead: {args.policy}, {args.instances} emulated "
                            f"instances, {len(records)} requests at {args.rate}/s")
        for column in ("measure", "median (ms)", "p99 (ms)", "candidates"):
            table.add_column(column, justify="right")
        num_candidates = int(np.median([len(r["scores"]) for r in records]))
        rows = {
            "enter predict -> publish on gpu.<k>": [r["overhead_ms"] for r in records
                                                    if "overhead_ms" in r],
            "  predict stage (DB + length model)": _stage(records, "predict"),
            "  hand-off to the route task (broker)": _stage(records, "handoff"),
            "  route task (DB + decision + publish)": _stage(records, "route"),
            "  of which the decision (all what-ifs)": [r["decision_ms"] for r in records],
        }
        for label, values in rows.items():
            table.add_row(label, f"{np.median(values):.2f}", f"{np.percentile(values, 99):.2f}",
                          str(num_candidates))
        Console().print(table)
        return 0
