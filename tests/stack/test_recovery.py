"""Recovery uses the whole fleet (issue: "a crash is not a prediction error"): an engine worker
killed with requests in flight, then started again, takes work at once: the requests re-routed
to the survivor and still waiting there are spread again over both, the returned instance serves
some of them, routing never falls back to round robin, and every request succeeds exactly once.
Emulated engines in real time (about 3 s a request), two seats each: the backlog re-routed to
the survivor outlasts the restart.

gpu.0 starts again only once everything re-routed off it waits on gpu.1: started earlier, the
returned gpu.0 would take the re-routes themselves (least requests), be busy when the sweep
first sees it, and there would be nothing to move (a CI run: the route worker's first decisions
waited seconds for the tokenizer, and gpu.0 was back before them)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pytest

from app.cli.stack import Stack
from tests.stack.native_requests import TERMINAL, submit, wait_terminal

pytestmark = pytest.mark.slow


def _instance(client, instance_id: str) -> dict:  # type: ignore[no-untyped-def]
    return next(i for i in client.get("/v1/instances").json()["data"] if i["id"] == instance_id)


def _wait_all_off(client, ids: list[str], instance_id: str,  # type: ignore[no-untyped-def]
                  timeout_s: float) -> None:
    """Until each request is routed to another instance, or finished."""
    deadline = time.monotonic() + timeout_s
    pending = set(ids)
    while pending:
        assert time.monotonic() < deadline, f"{len(pending)} not re-routed off {instance_id}"
        for request_id in sorted(pending):
            body = client.get(f"/v1/requests/{request_id}").json()
            if body["status"] in TERMINAL or (body["status"] in ("routed", "running")
                                             and body["instance_id"] != instance_id):
                pending.discard(request_id)
        time.sleep(0.1)


def test_a_restarted_engine_takes_the_waiting_backlog_at_once(
        start_stack: Callable[..., Stack]) -> None:
    stack = start_stack(2, engine_kind="emulated", emulated_time_scale=1.0,
                        emulated_output_lengths="max_tokens", max_num_seqs=2,
                        routing_policy="least_requests")
    with stack.client() as client:
        ids = [submit(client, prompt=f"Long answer {i}", max_tokens=128) for i in range(32)]
        deadline = time.monotonic() + 60
        while _instance(client, "gpu.0")["running"] == 0:
            assert time.monotonic() < deadline, "gpu.0 never ran anything"
            time.sleep(0.05)
        stack.kill("gpu.0")
        deadline = time.monotonic() + 30
        while _instance(client, "gpu.0")["alive"]:  # its heartbeat lapses: re-routed
            assert time.monotonic() < deadline
            time.sleep(0.1)
        _wait_all_off(client, ids, "gpu.0", timeout_s=60)
        stack.start_process("gpu.0", stack.commands["gpu.0"])
        results = wait_terminal(client, ids, timeout_s=240)
        routing = client.get("/v1/instances").json()["routing"]

    assert Counter(r["status"] for r in results.values()) == {"succeeded": 32}
    for r in results.values():
        assert [e["status"] for e in r["events"]].count("succeeded") == 1
    moved = [r for r in results.values()
             if any("returned idle" in (e["detail"] or "") for e in r["events"])]
    assert moved, "nothing waiting on gpu.1 went back to routing when gpu.0 returned"
    assert any(r["instance_id"] == "gpu.0" for r in moved), "the returned gpu.0 took none"
    assert routing["fallback"] is None and routing["policy"] == "least_requests"
