"""The showcase's last pass: a bulk job through the OpenAI-style Batch API, started just before
the interactive stream is replayed again under the showcase's predictive policy, so that the
two run side by side.

The batch's lines are other real prompts of the showcase set. The releaser lets batch lines into
the pipeline through a window that grows while the stream's TTFT p99 meets its target and halves
when it does not, never past the engine slots the stream is expected to leave free
(workers/batch/headroom.py), and each engine runs interactive requests before batch ones (class-
first priorities, vLLM's priority policy), keeps seats for them (engine_interactive_seats) and
runs batch prefills after theirs (engine_batch_prefill_last): the batch should take the room the
stream leaves, and finish once the stream is gone.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from rich.progress import Progress
from rich.table import Table

from app.cli.client import TERMINAL_BATCH
from domain.models import BatchStatus

__all__ = ["BatchRun", "BatchWatcher", "batch_input", "batch_table", "start_batch"]



def batch_input(prompts: list[str], *, model: str, rooms: list[int]) -> bytes:
    """The Batch API input file: one `/v1/completions` line per prompt, each asking for the
    whole room left in the context (max_tokens never reveals the answer's length)."""
    lines = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": model, "prompt": prompt, "max_tokens": room, "temperature": 0}}
             for i, (prompt, room) in enumerate(zip(prompts, rooms, strict=True))]
    return b"".join(json.dumps(line, ensure_ascii=False).encode() + b"\n" for line in lines)


def start_batch(client: httpx.Client, prompts: list[str], *,
                count_tokens: Callable[[str], int], max_model_len: int) -> str:
    """Upload the input file and create the batch; its id."""
    model = client.get("/v1/models").raise_for_status().json()["data"][0]["id"]
    rooms = [max_model_len - count_tokens(prompt) for prompt in prompts]
    upload = client.post("/v1/files", data={"purpose": "batch"}, files={
        "file": ("showcase-batch.jsonl", batch_input(prompts, model=model, rooms=rooms))})
    file_id = upload.raise_for_status().json()["id"]
    batch = client.post("/v1/batches", json={"input_file_id": file_id,
                                             "endpoint": "/v1/completions",
                                             "completion_window": "24h"})
    return str(batch.raise_for_status().json()["id"])


@dataclass(frozen=True)
class BatchRun:
    """What the batch did, in emulated seconds from its creation."""

    lines: int
    completed: int
    failed: int
    status: str
    #: Lines finished while the interactive stream still had requests in flight.
    done_during_stream: int
    stream_ended_s: float
    #: When its last line finished; None if it had not by the end of the pass.
    finished_s: float | None


class BatchWatcher(threading.Thread):
    """Polls the batch, moves its progress bar, and notes how far it got while the stream ran."""

    def __init__(self, client: httpx.Client, batch_id: str, progress: Progress, *,
                 lines: int, time_scale: float) -> None:
        super().__init__(daemon=True)
        self._client, self._batch_id, self._progress = client, batch_id, progress
        self._task = progress.add_task("batch beside the stream: lines done", total=lines)
        self._time_scale = time_scale
        self._created_at = time.monotonic()
        self._lines = lines
        self._done = self._completed = self._failed = 0
        self._status = str(BatchStatus.VALIDATING)
        self._stream_end: tuple[float, int] | None = None
        self._finished_at: float | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            body = self._client.get(f"/v1/batches/{self._batch_id}").json()
            counts = body["request_counts"]
            self._completed, self._failed = counts["completed"], counts["failed"]
            self._done, self._status = self._completed + self._failed, body["status"]
            self._progress.update(self._task, completed=self._done)
            if self._status in TERMINAL_BATCH:
                self._finished_at = time.monotonic()
                return
            self._stopping.wait(0.5)

    def stream_ended(self) -> None:
        self._stream_end = (time.monotonic(), self._done)

    def result(self, timeout_s: float) -> BatchRun:
        """Wait up to `timeout_s` for the batch to end, then what it did."""
        self.join(timeout_s)
        self._stopping.set()
        ended_at, done_then = self._stream_end or (time.monotonic(), self._done)
        return BatchRun(
            lines=self._lines, completed=self._completed, failed=self._failed,
            status=self._status, done_during_stream=done_then,
            stream_ended_s=self._emulated(ended_at),
            finished_s=None if self._finished_at is None else self._emulated(self._finished_at))

    def _emulated(self, at: float) -> float:
        return (at - self._created_at) / self._time_scale


def batch_table(ttft_alone: tuple[str, str], ttft_beside: tuple[str, str],
                run: BatchRun, *, policy: str) -> Table:
    """The stream's TTFT p50/p99 under `policy` without and with the batch, and the batch's
    progress."""
    table = Table(title=f"A {run.lines}-line batch beside the same stream ({policy}); "
                  "seconds are emulated")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("stream TTFT p50 / p99 (s), alone", " / ".join(ttft_alone))
    table.add_row("stream TTFT p50 / p99 (s), beside the batch", " / ".join(ttft_beside))
    table.add_row("batch lines done while the stream ran",
                  f"{run.done_during_stream} of {run.lines} (by {run.stream_ended_s:.0f} s)")
    finished = "not yet" if run.finished_s is None else f"{run.finished_s:.0f} s"
    table.add_row(f"batch {run.status}: lines completed / failed",
                  f"{run.completed} / {run.failed} (all done at {finished})")
    return table
