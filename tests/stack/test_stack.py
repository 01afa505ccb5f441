"""The whole local stack as processes: API, Celery workers, beat, vLLM engine workers.

Real PostgreSQL, Redis and vLLM (the tiny model); webhooks go to a receiver on 127.0.0.1.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import pytest
from openai import OpenAI
from sqlalchemy import func, select

from app.cli.stack import Stack
from domain.db import Database
from domain.models import EngineStepSample, WebhookDelivery
from tests.stack.native_requests import submit, wait_terminal
from tests.stack.webhook_receiver import WebhookReceiver, team_webhook_secret

pytestmark = pytest.mark.vllm  # the default engine kind: the real vLLM engine, tiny model

ORDER = ["queued", "predicting", "routed", "running", "succeeded"]


def _lifecycle(events: list[dict]) -> list[str]:
    """The statuses a request passed, its rebalance moves taken out.

    An instance that the sweep sees come up after the stack's first sweep counts as returned
    (workers.health.rebalance): while idle it may take a waiting request back to routing, a
    move recorded as "queued" with a "requeued: ... returned idle" detail. The move is the
    only other path allowed; after it, the request is routed again, or the old attempt's result
    (it had started meanwhile) lands first.
    """
    statuses: list[str] = []
    for event in events:
        if event["status"] == "queued" and statuses:
            assert (event["detail"] or "").startswith("requeued:"), event
            assert "returned idle" in event["detail"], event
            while statuses[-1] in ("routed", "running"):
                statuses.pop()
            continue
        statuses.append(event["status"])
    return statuses


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_requests_flow_end_to_end_with_webhooks(vllm_pair_stack: Stack) -> None:
    receiver = WebhookReceiver()
    stack = vllm_pair_stack
    client = stack.client()
    try:
        with ThreadPoolExecutor(8) as pool:
            ids = list(
                pool.map(
                    lambda i: submit(
                        client,
                        prompt=f"Question {i}: tell me about queues.",
                        max_tokens=8 + i % 24,
                        webhook_url=f"{receiver.url}/ok",
                    ),
                    range(95),
                )
            )
        flaky = [
            submit(client, prompt=f"Flaky {i}", max_tokens=8, webhook_url=f"{receiver.url}/flaky")
            for i in range(5)
        ]
        seen: dict[str, list[str]] = defaultdict(list)
        results = wait_terminal(client, ids + flaky, seen=seen)
    finally:
        client.close()

    assert Counter(r["status"] for r in results.values()) == {"succeeded": 100}
    assert {r["instance_id"] for r in results.values()} == {"gpu.0", "gpu.1"}
    for request_id, r in results.items():
        lifecycle = _lifecycle(r["events"])
        assert lifecycle in (ORDER, ORDER[:2] + ORDER[-1:]), r["events"]
        moved = lifecycle != [e["status"] for e in r["events"]]
        if not moved:
            assert [ORDER.index(s) for s in seen[request_id]] == sorted(
                ORDER.index(s) for s in seen[request_id]
            ), seen[request_id]
        created, routed, first, finished = (
            _at(r[k]) for k in ("created_at", "routed_at", "first_token_at", "finished_at")
        )
        assert created <= routed <= _at(r["started_at"]) <= first <= finished
        assert r["policy"] == "round_robin" and r["predictor"].startswith("length_model:")
        assert 1 <= r["output_tokens"] <= r["max_tokens"] and r["output"]
        assert r["predicted_output_tokens"] is not None

    secret = team_webhook_secret(stack.settings.resolved_database_url, team_name="local")
    _assert_webhooks(receiver, secret, ok_ids=set(ids), flaky_ids=set(flaky))
    receiver.close()

    db = Database(stack.settings.resolved_database_url)
    with db.session() as session:
        attempts = session.execute(
            select(
                WebhookDelivery.request_id, WebhookDelivery.attempt, WebhookDelivery.succeeded
            ).where(WebhookDelivery.request_id.in_(flaky))
        ).all()
        num_samples = session.scalar(select(func.count()).select_from(EngineStepSample))
    db.dispose()
    for request_id in flaky:
        mine = sorted((a, ok) for rid, a, ok in attempts if rid == request_id)
        assert mine == [(1, False), (2, False), (3, True)]
    assert num_samples and num_samples > 0


def _assert_webhooks(receiver: WebhookReceiver, secret: str, *, ok_ids: set[str],
                     flaky_ids: set[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with receiver.lock:
            delivered_ok = {
                json.loads(b)["data"]["id"] for p, _, b in receiver.deliveries if p == "/ok"
            }
            flaky_count = Counter(
                json.loads(b)["data"]["id"] for p, _, b in receiver.deliveries if p == "/flaky"
            )
        if delivered_ok == ok_ids and all(flaky_count[i] == 3 for i in flaky_ids):
            break
        time.sleep(0.2)
    assert delivered_ok == ok_ids
    assert all(flaky_count[i] == 3 for i in flaky_ids), flaky_count
    # Signed with the secret of the team that submitted the requests (the stack's "local").
    verifier = OpenAI(api_key="unused", base_url="http://127.0.0.1:9", webhook_secret=secret)
    for _path, headers, body in receiver.deliveries:
        event = verifier.webhooks.unwrap(body, headers)  # verifies the signature, or raises
        assert event.type == "request.succeeded"
        assert json.loads(body)["data"]["status"] == "succeeded"
    ids_per_event = {h["webhook-id"] for p, h, _ in receiver.deliveries if p == "/flaky"}
    assert len(ids_per_event) == len(flaky_ids)  # retries keep the event id


def test_cancel_a_running_request_aborts_it(vllm_stack: Stack) -> None:
    stack = vllm_stack
    with stack.client() as client:
        request_id = submit(client, prompt="Write forever.", max_tokens=1800)
        deadline = time.monotonic() + 60
        while client.get(f"/v1/requests/{request_id}").json()["status"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        cancelled = client.post(f"/v1/requests/{request_id}/cancel").json()
        assert cancelled["status"] == "cancelled"
        deadline = time.monotonic() + 30
        while client.get("/v1/instances").json()["data"][0]["running"] != 0:
            assert time.monotonic() < deadline, "the engine kept generating a cancelled request"
            time.sleep(0.1)
        final = client.get(f"/v1/requests/{request_id}").json()
    assert final["status"] == "cancelled" and final["output"] is None
    assert [e["status"] for e in final["events"]][-1] == "cancelled"


def test_continuous_batching_survives_celery(vllm_stack: Stack) -> None:
    stack = vllm_stack
    body = {"prompt": "Count slowly to a hundred.", "max_tokens": 256, "temperature": 0.0}
    with stack.client() as client:
        started = time.monotonic()
        ids = [submit(client, **body) for _ in range(32)]
        concurrent = wait_terminal(client, ids)
        concurrent_s = time.monotonic() - started

        started = time.monotonic()
        sequential = {}
        for _ in range(32):
            sequential.update(wait_terminal(client, [submit(client, **body)]))
        sequential_s = time.monotonic() - started

    assert all(r["status"] == "succeeded" for r in [*concurrent.values(), *sequential.values()])
    tokens = sum(r["output_tokens"] for r in concurrent.values())
    assert tokens >= 32 * 8
    print(f"32 concurrent: {concurrent_s:.2f} s, 32 sequential: {sequential_s:.2f} s")
    assert concurrent_s < sequential_s / 3, (concurrent_s, sequential_s)
    db = Database(stack.settings.resolved_database_url)
    with db.session() as session:
        widest = session.scalar(select(func.max(EngineStepSample.num_seqs)))
    db.dispose()
    assert widest is not None and widest >= 16


@pytest.mark.spends_stack  # kills gpu.0
def test_sigkilled_engine_worker_loses_nothing(vllm_pair_stack: Stack) -> None:
    stack = vllm_pair_stack
    with stack.client() as client:
        ids = [submit(client, prompt=f"Long answer {i}", max_tokens=160) for i in range(40)]
        deadline = time.monotonic() + 60
        while True:
            gpu0 = next(i for i in client.get("/v1/instances").json()["data"] if i["id"] == "gpu.0")
            if gpu0["running"] > 0:
                break
            assert time.monotonic() < deadline, "gpu.0 never ran anything"
            time.sleep(0.05)
        stack.kill("gpu.0")
        results = wait_terminal(client, ids)

    assert Counter(r["status"] for r in results.values()) == {"succeeded": 40}
    requeued = [
        r for r in results.values() if any("lost" in (e["detail"] or "") for e in r["events"])
    ]
    assert requeued, "no request was running on the killed instance"
    for r in results.values():
        assert [e["status"] for e in r["events"]].count("succeeded") == 1
    assert all(r["instance_id"] == "gpu.1" for r in requeued)
