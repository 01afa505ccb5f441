"""Operations on the running stack: the admin API (drain, pause/resume, queues, routing switch)
and the Celery recipes of docs/operations.md, run as written."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Callable

import httpx
import pytest

from app.cli.stack import Stack
from tests.environment import ROOT
from tests.stack.native_requests import submit, wait_terminal

CELERY = str(ROOT / ".venv" / "bin" / "celery")


def _celery(stack: Stack, *args: str) -> str:
    """`celery -A workers ...` as an operator types it, with the stack's settings."""
    done = subprocess.run([CELERY, "-A", "workers", *args], env=stack.env, capture_output=True,
                          text=True, timeout=60, check=True)
    return done.stdout


def _burst(client: httpx.Client, count: int, first: int = 0) -> list[str]:
    return [submit(client, prompt=f"Question {i}.", max_tokens=16)
            for i in range(first, first + count)]


def _statuses(client: httpx.Client, ids: list[str]) -> list[dict]:
    return [client.get(f"/v1/requests/{i}").json() for i in ids]


def _until(predicate: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.2)


def test_admin_api_drains_pauses_and_switches_routing(emulated_stack: Stack) -> None:
    stack = emulated_stack  # two emulated instances, round robin (the default policy)
    assert stack.settings.routing_policy == "round_robin"
    user_key = stack.issue_api_key("users")
    with stack.client() as admin, stack.client(user_key) as user:
        assert user.get("/v1/admin/queues").status_code == 403

        # Switch routing at run time, and back.
        switched = admin.put("/v1/admin/routing", json={"policy": "least_requests"}).json()
        assert switched["policy"] == switched["override"] == "least_requests"
        routed = wait_terminal(user, _burst(user, 4))
        assert {r["policy"] for r in routed.values()} == {"least_requests"}
        assert admin.put("/v1/admin/routing", json={"policy": "nonsense"}).status_code == 400
        restored = admin.put("/v1/admin/routing", json={"policy": None}).json()
        assert restored["policy"] == "round_robin" and restored["override"] is None

        # A drained instance gets nothing new; resumed, it is chosen again.
        assert admin.post("/v1/admin/instances/gpu.0/drain").json()["control"] == "drained"
        drained = wait_terminal(user, _burst(user, 8, first=10))
        assert {r["instance_id"] for r in drained.values()} == {"gpu.1"}
        listed = {i["id"]: i for i in user.get("/v1/instances").json()["data"]}
        assert listed["gpu.0"]["control"] == "drained" and not listed["gpu.0"]["accepting"]
        admin.post("/v1/admin/instances/gpu.0/resume")
        resumed = wait_terminal(user, _burst(user, 8, first=20))
        assert Counter(r["instance_id"] for r in resumed.values()) == {"gpu.0": 4, "gpu.1": 4}

        # Paused: no routing to it, and its worker consumes nothing from its queue.
        assert admin.post("/v1/admin/instances/gpu.1/pause").json()["control"] == "paused"
        assert not _consumes(stack, "gpu.1") and _consumes(stack, "gpu.0")
        paused = wait_terminal(user, _burst(user, 6, first=30))
        assert {r["instance_id"] for r in paused.values()} == {"gpu.0"}
        admin.post("/v1/admin/instances/gpu.1/resume")
        assert _consumes(stack, "gpu.1")

        queues = admin.get("/v1/admin/queues").json()
        assert {q["queue"] for q in queues["queues"]} >= {"predict", "route", "gpu.0", "gpu.1"}
        assert {i["id"] for i in queues["instances"]} == {"gpu.0", "gpu.1"}
        assert admin.post("/v1/admin/instances/gpu.9/drain").status_code == 404


def _consumes(stack: Stack, queue: str) -> bool:
    replies = json.loads(_celery(stack, "inspect", "-t", "5", "active_queues", "-j"))
    return any(q["name"] == queue for queues in replies.values() for q in queues)


@pytest.mark.spends_stack  # leaves gpu.1's consumer cancelled and its queue purged
def test_readme_recipes_pause_a_gpu_queue_and_resume_it(emulated_stack: Stack) -> None:
    stack = emulated_stack  # two emulated instances, round robin (the default policy)
    assert stack.settings.routing_policy == "round_robin"
    node = f"gpu.0@{socket.gethostname()}"
    with stack.client() as client:
        # Pause consumption of gpu.0 (docs/operations.md).
        assert "OK" in _celery(stack, "control", "-t", "5", "cancel_consumer", "gpu.0", "-d", node)
        ids = _burst(client, 10)
        _until(lambda: sum(r["status"] == "succeeded" for r in _statuses(client, ids)) == 5)
        time.sleep(1.0)
        held = [r for r in _statuses(client, ids) if r["status"] != "succeeded"]
        assert len(held) == 5 and {r["instance_id"] for r in held} == {"gpu.0"}
        assert all(r["status"] == "routed" for r in held)  # waiting in the paused queue
        depth = client.get("/v1/admin/queues").json()
        assert next(i for i in depth["instances"] if i["id"] == "gpu.0")["queued"] == 5

        # Inspect, rate-limit, resume (docs/operations.md).
        assert node in _celery(stack, "inspect", "-t", "5", "reserved")
        assert "new rate limit set successfully" in _celery(
            stack, "control", "-t", "5", "rate_limit", "serve.generate", "100/s")
        assert "OK" in _celery(stack, "control", "-t", "5", "add_consumer", "gpu.0", "-d", node)
        finished = wait_terminal(client, ids)
        assert Counter(r["status"] for r in finished.values()) == {"succeeded": 10}

        # Purge a queue (docs/operations.md): messages waiting in gpu.1 are dropped.
        _celery(stack, "control", "-t", "5", "cancel_consumer", "gpu.1", "-d",
                f"gpu.1@{socket.gethostname()}")
        stranded = _burst(client, 4, first=50)
        _until(lambda: sum(r["status"] == "routed" and r["instance_id"] == "gpu.1"
                           for r in _statuses(client, stranded)) == 2)
        assert "Purged 2 messages" in _celery(stack, "purge", "-f", "-Q", "gpu.1")
