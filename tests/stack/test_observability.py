"""Metrics and logs of the whole local stack (emulated engines): GET /metrics adds up every
process and moves with the traffic; one request's id is in the JSON log lines of every stage."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.cli.stack import Stack
from tests.environment import TEST_WEBHOOK_SECRET
from tests.stack.native_requests import submit, wait_terminal
from tests.stack.webhook_receiver import WebhookReceiver

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(stack: Stack) -> Samples:
    """Every sample of GET /metrics (asked without an API key), by sample name."""
    response = httpx.get(f"{stack.api_url}/metrics", timeout=10)
    assert response.status_code == 200, response.text
    found: Samples = defaultdict(list)
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            found[sample.name].append((sample.labels, sample.value))
    return found


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(value for got, value in samples.get(name, ())
               if all(got.get(k) == v for k, v in labels.items()))


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    values: dict[str, float] = defaultdict(float)
    for got, value in samples.get(name, ()):
        values[got[label]] += value
    return dict(values)


def test_metrics_add_up_every_process_and_move(
    start_stack: Callable[..., Stack],
) -> None:
    stack = start_stack(2, engine_kind="emulated", emulated_time_scale=0.05,
                        routing_policy="block", metrics_counts_cache_s=0)  # counts move at once
    before = scrape(stack)
    num_requests = 20
    with stack.client() as client, ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(
            lambda i: submit(client, prompt=f"Question {i}: tell me about queues.",
                             max_tokens=8 + i),
            range(num_requests)))
        results = wait_terminal(client, ids)
    assert all(r["status"] == "succeeded" for r in results.values())

    # The completion metrics are observed just after the commit the client saw: wait for them.
    deadline = time.monotonic() + 15
    while True:
        after = scrape(stack)
        done = total(after, "blockq_request_e2e_seconds_count") - total(
            before, "blockq_request_e2e_seconds_count")
        if done >= num_requests or time.monotonic() > deadline:
            break
        time.sleep(0.2)

    def moved(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    # Read when scraped: request counts, queue depths, engine states, the fallback.
    assert moved("blockq_requests", status="succeeded", priority="interactive") == num_requests
    assert {"predict", "route", "webhooks", "gpu.0", "gpu.1"} <= set(
        by_label(after, "blockq_queue_messages", "queue"))
    for name in ("blockq_engine_alive", "blockq_engine_running_requests",
                 "blockq_engine_waiting_requests", "blockq_engine_kv_cache_usage_ratio"):
        assert {(labels["instance_id"], labels["engine_kind"]) for labels, _ in after[name]} == {
            ("gpu.0", "emulated"), ("gpu.1", "emulated")}, name
    assert total(after, "blockq_engine_alive") == 2
    assert "blockq_routing_fallback_active" in after
    assert all(value == 1 for _, value in after["blockq_scrape_collector_success"])

    # Pushed by the workers, added up by the API: completions (engine hosts), decisions (router).
    for name in ("blockq_request_ttft_seconds_count", "blockq_request_e2e_seconds_count",
                 "blockq_length_prediction_error_ratio_count",
                 "blockq_routing_overhead_seconds_count",
                 "blockq_routing_decision_seconds_count"):
        assert moved(name) == num_requests, name
    # Only decisions the block policy simulated predict a latency (a fallback routes without).
    assert 1 <= moved("blockq_latency_prediction_error_ratio_count") <= num_requests
    decisions = {instance: count - dict(by_label(before, "blockq_routing_decisions_total",
                                                 "instance_id")).get(instance, 0)
                 for instance, count in by_label(after, "blockq_routing_decisions_total",
                                                 "instance_id").items()}
    assert set(decisions) <= {"gpu.0", "gpu.1"}
    assert sum(decisions.values()) == num_requests
    routed_to = defaultdict(int)
    for r in results.values():
        routed_to[r["instance_id"]] += 1
    assert {k: v for k, v in decisions.items() if v} == dict(routed_to)
    for instance in routed_to:
        labels = {"instance_id": instance, "engine_kind": "emulated"}
        assert moved("blockq_engine_generated_tokens_total", **labels) > 0
        assert moved("blockq_engine_step_duration_seconds_count", **labels) > 0
    assert total(after, "blockq_request_ttft_seconds_sum") > total(
        before, "blockq_request_ttft_seconds_sum")


def json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON log records of one process's log (other output, e.g. banners, skipped)."""
    records = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def test_a_requests_id_is_in_the_json_logs_of_every_stage(emulated_stack: Stack) -> None:
    receiver = WebhookReceiver()
    stack = emulated_stack  # two emulated instances; its settings ask for JSON logs
    assert stack.settings.log_format == "json"
    try:
        with stack.client() as client:
            request_id = submit(client, prompt="Tell me about logs.", max_tokens=16,
                                webhook_url=f"{receiver.url}/ok")
            result = wait_terminal(client, [request_id])[request_id]
    finally:
        deadline = time.monotonic() + 15
        while not receiver.deliveries and time.monotonic() < deadline:
            time.sleep(0.1)
        receiver.close()
    assert result["status"] == "succeeded"

    # The predict worker also routes (route_in_predict): the decision is logged there.
    processes = ["api", "predict", result["instance_id"], "webhooks"]
    deadline = time.monotonic() + 15
    while True:
        mine = {name: [r for r in json_lines(stack.log_dir / f"{name}.log")
                       if r.get("request_id") == request_id] for name in processes}
        if all(mine.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert all(mine.values()), {name: len(records) for name, records in mine.items()}
    for name, records in mine.items():
        for record in records:
            assert {"time", "level", "logger", "message", "role"} <= set(record), record
            assert record["role"] == name, record
    # The API's access-log line of the call carries it (its "request created" is at debug).
    assert any(r["message"].startswith("POST /v1/requests") for r in mine["api"])
    assert any(r.get("instance_id") == result["instance_id"] for r in mine["predict"])

    # No secret in any log: the API key the client used, the webhook signing secret.
    assert stack.api_key
    for log in stack.log_dir.glob("*.log"):
        text = log.read_text(errors="replace")
        assert stack.api_key not in text, log
        assert TEST_WEBHOOK_SECRET not in text, log
