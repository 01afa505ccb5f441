"""The emulated engine behind the real pipeline: API, Celery workers, PostgreSQL and Redis."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import func, select

from app.cli.stack import Stack
from domain.db import Database
from domain.models import EngineStepSample
from tests.stack.native_requests import submit, wait_terminal


def test_emulated_instances_serve_requests_end_to_end(emulated_stack: Stack) -> None:
    stack = emulated_stack  # two emulated instances, 20 times faster than real time
    with stack.client() as client:
        instances = client.get("/v1/instances").json()["data"]
        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(
                lambda i: submit(client, prompt=f"Question {i}: tell me about queues.",
                                 max_tokens=8 + i % 24),
                range(50),
            ))
        results = wait_terminal(client, ids)

    assert {i["id"]: i["engine_kind"] for i in instances} == {
        "gpu.0": "emulated", "gpu.1": "emulated"}
    assert all(i["total_kv_blocks"] == 7288 and i["config"]["block_size"] == 16
               for i in instances)
    assert Counter(r["status"] for r in results.values()) == {"succeeded": 50}
    assert {r["instance_id"] for r in results.values()} == {"gpu.0", "gpu.1"}
    for r in results.values():
        assert r["created_at"] <= r["routed_at"] <= r["first_token_at"] <= r["finished_at"]
        assert 1 <= r["output_tokens"] <= r["max_tokens"]
        assert r["output"].startswith("tok")
    assert _num_step_samples(stack) > 0


def _num_step_samples(stack: Stack, timeout_s: float = 10.0) -> int:
    """Step samples in the database, once the engine workers' periodic flush wrote some."""
    db = Database(stack.settings.resolved_database_url)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            with db.session() as session:
                count = session.scalar(select(func.count()).select_from(EngineStepSample)) or 0
            if count or time.monotonic() > deadline:
                return count
            time.sleep(0.2)
    finally:
        db.dispose()


def test_block_routing_records_every_decision(
    start_stack: Callable[..., Stack],
) -> None:
    stack = start_stack(3, engine_kind="emulated", emulated_time_scale=0.05,
                        routing_policy="block")
    with stack.client() as client:
        ids = [submit(client, prompt=f"Explain topic {i} in depth.", max_tokens=64 + i)
               for i in range(45)]
        results = wait_terminal(client, ids)

    assert Counter(r["status"] for r in results.values()) == {"succeeded": 45}
    assert {r["instance_id"] for r in results.values()} == {"gpu.0", "gpu.1", "gpu.2"}
    for r in results.values():
        routing = r["routing"]
        assert r["policy"] == "block"
        assert set(routing["scores"]) == set(routing["what_ifs"]) == {"gpu.0", "gpu.1", "gpu.2"}
        # The winner has the lowest simulated end-to-end latency (the block policy's score).
        assert routing["scores"][r["instance_id"]] == min(routing["scores"].values())
        assert routing["decision_ms"] > 0 and routing["overhead_ms"] >= routing["decision_ms"]
        stages = routing["stages_ms"]
        assert stages["route"] >= routing["decision_ms"]
        assert abs(sum(stages.values()) - routing["overhead_ms"]) < 1.0


def test_every_celery_worker_logs_ready(emulated_stack: Stack) -> None:
    emulated_stack.wait_workers_ready(timeout_s=120)  # raises StackError naming the laggards
