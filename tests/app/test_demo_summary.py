"""The demo's sample-job summary shows only figures that mean something (app/cli/demo.py)."""

from __future__ import annotations

from typing import Any

from app.cli.demo import JobSummary, length_note, summary_rows


def _result(output_tokens: int, *, max_tokens: int = 64, predicted: int = 64,
            finish_reason: str | None = None, instance: str = "gpu.0") -> dict[str, Any]:
    return {
        "status": "succeeded", "instance_id": instance, "output_tokens": output_tokens,
        "max_tokens": max_tokens, "predicted_output_tokens": predicted,
        "finish_reason": finish_reason or ("length" if output_tokens >= max_tokens else "stop"),
        "created_at": "2026-01-01T00:00:00+00:00", "first_token_at": "2026-01-01T00:00:01+00:00",
        "finished_at": "2026-01-01T00:00:03+00:00",
    }


def test_length_error_left_out_when_every_request_ran_to_its_cap() -> None:
    results = [_result(64, instance=f"gpu.{i % 2}") for i in range(20)]
    summary = JobSummary.of(results, wall_s=10.0)
    metrics = dict(summary_rows(summary))

    assert not any("error" in name or "predicted" in name for name in metrics)
    assert metrics["requests on gpu.0"] == "10" and metrics["requests on gpu.1"] == "10"
    assert metrics["TTFT p50 / p99 (s)"] == "1.00 / 1.00"
    assert metrics["end-to-end latency p50 / p99 (s)"] == "3.00 / 3.00"
    assert metrics["throughput (output tokens/s)"] == "128"
    note = length_note(summary)
    assert note is not None and "20 of 20 requests ran until their max_tokens" in note


def test_length_error_shown_over_requests_that_ended_on_their_own() -> None:
    natural = [_result(30, predicted=40) for _ in range(12)]
    capped = [_result(64, predicted=64) for _ in range(8)]
    summary = JobSummary.of(natural + capped, wall_s=1.0)
    metrics = dict(summary_rows(summary))

    assert metrics["requests that ended on their own (12): mean absolute error (tokens)"] == "10.0"
    assert metrics["requests that ended on their own (12): mean predicted / actual tokens"] == (
        "40.0 / 30.0")
    assert metrics["throughput (output tokens/s)"] == str(12 * 30 + 8 * 64)
    assert length_note(summary) is None


def test_too_few_natural_ends_count_as_none() -> None:
    results = [_result(30, predicted=40) for _ in range(3)] + [_result(64) for _ in range(30)]
    summary = JobSummary.of(results, wall_s=1.0)

    assert not summary.shows_length_error
    assert not any("error" in name for name, _ in summary_rows(summary))
