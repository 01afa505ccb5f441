"""The sample job: push the shipped prompts through the real API, wait, and summarize."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
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

from domain.models import RequestStatus

__all__ = [
    "JobSummary", "length_note", "load_sample_prompts", "run_sample_job", "summarize",
    "summary_rows",
]

TERMINAL = {status.value for status in RequestStatus if status.is_terminal}


def load_sample_prompts(limit: int | None = None) -> list[dict[str, Any]]:
    text = resources.files("app.demo").joinpath("sample_prompts.jsonl").read_text()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return rows[:limit] if limit else rows


def run_sample_job(
    client: httpx.Client, prompts: list[dict[str, Any]], *, concurrency: int = 16,
    timeout_s: float = 900, models: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Submit every prompt (prompt i to models[i % len(models)]; none given: the default
    model), then poll until all are terminal. Returns the final request objects."""
    named = [models[i % len(models)] if models else None for i in range(len(prompts))]
    with client:
        with ThreadPoolExecutor(concurrency) as pool:
            ids = list(pool.map(lambda pair: _submit(client, *pair), zip(prompts, named,
                                                                           strict=True)))
        return _wait_all(client, ids, timeout_s=timeout_s)


def _submit(client: httpx.Client, row: dict[str, Any], model: str | None = None) -> str:
    body = {
        **({"model": model} if model else {}),
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


#: Length figures (predicted vs actual output tokens) are shown only over requests that ended on
#: their own, and only when at least this many did.
MIN_NATURAL_ENDS = 10


@dataclass(frozen=True)
class JobSummary:
    num_requests: int
    statuses: dict[str, int]
    per_instance: dict[str, int]
    ttft_s: list[float]
    e2e_s: list[float]
    #: Predicted and actual output tokens of the succeeded requests that ended before max_tokens.
    predicted_tokens: list[int]
    actual_tokens: list[int]
    #: Output tokens of every succeeded request (throughput).
    total_output_tokens: int
    #: Succeeded requests that ran until their max_tokens.
    capped: int
    wall_s: float

    @classmethod
    def of(cls, results: list[dict[str, Any]], wall_s: float) -> JobSummary:
        ok = [r for r in results if r["status"] == "succeeded"]
        natural = [r for r in ok if not _ran_to_cap(r)]
        return cls(
            num_requests=len(results),
            statuses=dict(Counter(r["status"] for r in results)),
            per_instance=dict(sorted(Counter(_instance_label(r) for r in ok).items())),
            ttft_s=[s for r in ok if (s := _seconds(r["first_token_at"], r["created_at"]))],
            e2e_s=[s for r in ok if (s := _seconds(r["finished_at"], r["created_at"]))],
            predicted_tokens=[r["predicted_output_tokens"] for r in natural],
            actual_tokens=[r["output_tokens"] for r in natural],
            total_output_tokens=sum(r["output_tokens"] or 0 for r in ok),
            capped=len(ok) - len(natural),
            wall_s=wall_s,
        )

    @property
    def shows_length_error(self) -> bool:
        """Whether predicted vs actual output length means something in this run.

        A request that ran until max_tokens says nothing about when its answer would have ended,
        and predictions are capped at max_tokens: on such requests the error is zero by
        construction (the demo's tiny random-weight model never stops on its own)."""
        return len(self.actual_tokens) >= MIN_NATURAL_ENDS


def _instance_label(result: dict[str, Any]) -> str:
    """'gpu.0', or 'gpu.0 (tiny-llama)' when the request names its model."""
    model = result.get("model")
    return f"{result['instance_id']} ({model})" if model else str(result["instance_id"])


def _ran_to_cap(result: dict[str, Any]) -> bool:
    if result.get("finish_reason") == "length":
        return True
    return result["output_tokens"] is not None and result["output_tokens"] >= result["max_tokens"]


def summary_rows(summary: JobSummary) -> list[tuple[str, str]]:
    """The (metric, value) rows of the sample job's table: only figures that mean something."""
    rows = [(f"requests {status}", str(count))
            for status, count in sorted(summary.statuses.items())]
    rows += [(f"requests on {instance_id}", str(count))
             for instance_id, count in summary.per_instance.items()]
    for name, values in (("TTFT", summary.ttft_s), ("end-to-end latency", summary.e2e_s)):
        if values:
            rows.append((f"{name} p50 / p99 (s)",
                         f"{np.percentile(values, 50):.2f} / {np.percentile(values, 99):.2f}"))
    if summary.wall_s > 0 and summary.total_output_tokens:
        rows.append(("throughput (output tokens/s)",
                     f"{summary.total_output_tokens / summary.wall_s:.0f}"))
    if summary.shows_length_error:
        predicted = np.array(summary.predicted_tokens, dtype=float)
        actual = np.array(summary.actual_tokens, dtype=float)
        label = f"requests that ended on their own ({len(actual)})"
        rows.append((f"{label}: mean predicted / actual tokens",
                     f"{predicted.mean():.1f} / {actual.mean():.1f}"))
        rows.append((f"{label}: mean absolute error (tokens)",
                     f"{np.abs(predicted - actual).mean():.1f}"))
    return rows


def length_note(summary: JobSummary) -> str | None:
    """Why the length figures are left out, when they are."""
    if summary.shows_length_error:
        return None
    ok = sum(summary.per_instance.values())
    return (f"Output-length figures left out: {summary.capped} of {ok} requests ran until their "
            "max_tokens (the tiny random-weight model never stops on its own, and predictions are "
            "capped at max_tokens, so predicted and actual lengths agree by construction). The "
            "routing showcase measures the length model on real answer lengths.")


def summarize(summary: JobSummary, console: Console) -> None:
    table = Table(title=f"Sample job: {summary.num_requests} requests sent at once, done in "
                  f"{summary.wall_s:.1f} s (real vLLM engines, tiny random-weight model)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for metric, value in summary_rows(summary):
        table.add_row(metric, value)
    console.print(table)
    if (note := length_note(summary)) is not None:
        console.print(note)
