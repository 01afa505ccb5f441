"""The sample job: push the shipped prompts through the real API, wait, and summarize."""

from __future__ import annotations

import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

__all__ = ["load_sample_prompts", "run_sample_job", "summarize", "JobSummary"]

TERMINAL = {"succeeded", "failed", "cancelled"}


def load_sample_prompts(limit: int | None = None) -> list[dict[str, Any]]:
    text = resources.files("app.demo").joinpath("sample_prompts.jsonl").read_text()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return rows[:limit] if limit else rows


def run_sample_job(
    client: httpx.Client, prompts: list[dict[str, Any]], *, concurrency: int = 16,
    timeout_s: float = 900,
) -> list[dict[str, Any]]:
    """Submit every prompt, then poll until all are terminal. Returns the final request objects."""
    with client:
        with ThreadPoolExecutor(concurrency) as pool:
            ids = list(pool.map(lambda row: _submit(client, row), prompts))
        return _wait_all(client, ids, timeout_s=timeout_s)


def _submit(client: httpx.Client, row: dict[str, Any]) -> str:
    body = {
        "prompt": row["prompt"],
        "max_tokens": row["max_tokens"],
        "temperature": 0.8,
        "metadata": {"source": row.get("source", "sample")},
    }
    response = client.post("/v1/requests", json=body)
    response.raise_for_status()
    return response.json()["id"]


def _wait_all(client: httpx.Client, ids: list[str], *, timeout_s: float) -> list[dict[str, Any]]:
    done: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    with Progress(transient=True) as progress:
        task = progress.add_task("requests finished", total=len(ids))
        while len(done) < len(ids) and time.monotonic() < deadline:
            for request_id in ids:
                if request_id not in done:
                    body = client.get(f"/v1/requests/{request_id}").json()
                    if body["status"] in TERMINAL:
                        done[request_id] = body
            progress.update(task, completed=len(done))
            if len(done) < len(ids):
                time.sleep(0.5)
    missing = [request_id for request_id in ids if request_id not in done]
    if missing:
        raise TimeoutError(f"{len(missing)} requests unfinished after {timeout_s:.0f} s")
    return [done[request_id] for request_id in ids]


def _seconds(later: str | None, earlier: str | None) -> float | None:
    if later is None or earlier is None:
        return None
    return (datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds()


@dataclass(frozen=True)
class JobSummary:
    num_requests: int
    statuses: dict[str, int]
    per_instance: dict[str, int]
    ttft_s: list[float]
    e2e_s: list[float]
    predicted_tokens: list[int]
    actual_tokens: list[int]
    wall_s: float

    @classmethod
    def of(cls, results: list[dict[str, Any]], wall_s: float) -> JobSummary:
        ok = [r for r in results if r["status"] == "succeeded"]
        return cls(
            num_requests=len(results),
            statuses=dict(Counter(r["status"] for r in results)),
            per_instance=dict(sorted(Counter(r["instance_id"] for r in ok).items())),
            ttft_s=[s for r in ok if (s := _seconds(r["first_token_at"], r["created_at"]))],
            e2e_s=[s for r in ok if (s := _seconds(r["finished_at"], r["created_at"]))],
            predicted_tokens=[r["predicted_output_tokens"] for r in ok],
            actual_tokens=[r["output_tokens"] for r in ok],
            wall_s=wall_s,
        )


def summarize(summary: JobSummary, console: Console) -> None:
    table = Table(title=f"Sample job: {summary.num_requests} requests in {summary.wall_s:.1f} s")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for status, count in sorted(summary.statuses.items()):
        table.add_row(f"requests {status}", str(count))
    for instance_id, count in summary.per_instance.items():
        table.add_row(f"requests on {instance_id}", str(count))
    for name, values in (("TTFT", summary.ttft_s), ("end-to-end latency", summary.e2e_s)):
        if values:
            table.add_row(
                f"{name} p50 / p99 (s)",
                f"{np.percentile(values, 50):.2f} / {np.percentile(values, 99):.2f}",
            )
    if summary.actual_tokens:
        predicted = np.array(summary.predicted_tokens, dtype=float)
        actual = np.array(summary.actual_tokens, dtype=float)
        table.add_row(
            "output tokens: mean predicted / mean actual",
            f"{predicted.mean():.1f} / {actual.mean():.1f}",
        )
        table.add_row(
            "output tokens: mean absolute error", f"{np.abs(predicted - actual).mean():.1f}"
        )
        table.add_row("throughput (output tokens/s)", f"{actual.sum() / summary.wall_s:.0f}")
    console.print(table)
