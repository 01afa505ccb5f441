"""Scale from zero and back to zero on the local stack: emulated engines with a cold start
(start_s), the autoscaler driving the stack's engine workers, nothing lost on the way."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from app.cli.autoscaler import COLD_STARTS_KEY, StackAutoscaler
from app.cli.stack import Stack
from domain.settings import Settings
from tests.stack.native_requests import submit, wait_terminal

MODEL = "tiny-llama"
#: One autoscaled entry, asleep at start; a 40 s (emulated) cold start, 2 s at time scale 0.05.
FLEET = json.dumps([{"model": MODEL, "engine": "emulated", "count": 0, "min_count": 0,
                     "max_count": 2, "start_s": 40, "exec_model": "llama-2-7b-a30"}])


def _stream(stack: Stack) -> tuple[int, list[str]]:
    """A streamed completion: its status and the data lines it carried."""
    with stack.client(timeout=120) as client, client.stream(
            "POST", "/v1/completions", json={"model": MODEL, "prompt": "Stream me",
                                             "max_tokens": 6, "stream": True}) as response:
        return response.status_code, [line for line in response.iter_lines()
                                      if line.startswith("data: ")]


def _until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not {what} after {timeout_s:.0f} s"
        time.sleep(0.25)


def test_a_model_scales_from_zero_and_back_to_zero_losing_nothing(
        start_stack: Callable[..., Stack]) -> None:
    stack = start_stack(1, fleet=Settings(fleet=FLEET).fleet, engine_kind="emulated",
                        emulated_time_scale=0.05, autoscale=True, autoscale_interval_s=0.5,
                        autoscale_window_s=6.0, autoscale_scale_down_after_s=2.0,
                        autoscale_max_wait_s=120.0)
    with stack.client() as client:
        assert client.get("/v1/instances").json()["data"] == []  # asleep
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [MODEL]
    autoscaler = StackAutoscaler(stack, stack.settings)
    autoscaler.start()
    try:
        with ThreadPoolExecutor(2) as pool, stack.client(timeout=120) as client:
            # Held calls first: they arrive at zero, and wait for the cold start.
            streamed = pool.submit(_stream, stack)
            sync = pool.submit(client.post, "/v1/completions",
                               json={"model": MODEL, "prompt": "Wake up", "max_tokens": 4})
            ids = [submit(client, model=MODEL, prompt=f"Queued at zero {i}", max_tokens=8)
                   for i in range(10)]
            answer = sync.result(timeout=150)
            status, lines = streamed.result(timeout=150)
            results = wait_terminal(client, ids)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["text"].startswith("tok")
        assert status == 200 and lines[-1] == "data: [DONE]"
        assert any('"text": "tok' in line or '"text":"tok' in line for line in lines)
        assert Counter(r["status"] for r in results.values()) == {"succeeded": 10}

        # The autoscaler records the cold start on its next pass after the first token.
        reports = redis.Redis.from_url(stack.settings.redis_url)
        _until(lambda: reports.llen(COLD_STARTS_KEY) > 0, 30, "a cold start recorded")
        cold = json.loads(reports.lindex(COLD_STARTS_KEY, 0))
        assert cold["model"] == MODEL
        assert cold["ready_s"] > 0 and cold["first_token_s"] >= cold["ready_s"] - 1
        assert cold["model_load_s"] == pytest.approx(40 * 0.05, abs=1.0)

        # No more demand: after the window and the scale-down delay, back to zero.
        _until(lambda: all(s.phase == "stopped" for s in autoscaler.slots.values()), 120,
               "back at zero")
        with stack.client() as client:
            alive = [i for i in client.get("/v1/instances").json()["data"] if i["alive"]]
            metrics = client.get("/metrics").text
        assert alive == []
        assert any(line.startswith("blockq_desired_instances{") and f'model="{MODEL}"' in line
                   and line.endswith(" 0.0") for line in metrics.splitlines()), metrics
        assert any(line.startswith("blockq_autoscale_decisions_total{")
                   and 'action="down"' in line for line in metrics.splitlines())
        with stack.client() as client:
            again = {r["id"]: r["status"] for r in wait_terminal(client, ids).values()}
        assert set(again.values()) == {"succeeded"}  # nothing lost, nothing redone
    finally:
        autoscaler.stop()


def test_a_start_that_fails_is_retried_and_reported(start_stack: Callable[..., Stack]) -> None:
    """An entry whose model cannot load: the supervisor restarts it with backoff, the
    autoscaler reports the failure; the routing never waits on it (no instance is up)."""
    fleet = json.dumps([{"model": "missing-model", "engine": "vllm", "count": 0,
                         "max_count": 1, "model_path": "/nonexistent/model"}])
    stack = start_stack(1, fleet=Settings(fleet=fleet).fleet, autoscale=True,
                        autoscale_interval_s=0.5)
    autoscaler = StackAutoscaler(stack, stack.settings)
    with stack.client() as client:
        accepted = client.post("/v1/requests", json={"model": "missing-model",
                                                     "prompt": "Hi", "max_tokens": 2})
    assert accepted.status_code == 202, accepted.text
    stack.supervise()
    autoscaler.start()
    try:
        reports = redis.Redis.from_url(stack.settings.redis_url)
        _until(lambda: any(json.loads(r)["event"] == "start_failed"
                           for r in reports.lrange("blockq:autoscale:reports", 0, -1)),
               90, "reported")
        with stack.client() as client:
            assert client.get("/v1/instances").json()["data"] == [] or not any(
                i["alive"] for i in client.get("/v1/instances").json()["data"])
            shown = client.get(f"/v1/requests/{accepted.json()['id']}").json()
        assert shown["status"] in ("queued", "predicting")  # waits; not lost, not failed
    finally:
        autoscaler.stop()



def test_a_drain_under_load_sends_waiting_work_back_and_stops_only_when_done(
        start_stack: Callable[..., Stack]) -> None:
    """Two busy instances (two seats each); one is drained: its waiting requests go back to
    routing (the other serves them), its running ones finish there, then it stops. Every
    request succeeds once."""
    fleet = json.dumps([{"model": MODEL, "engine": "emulated", "count": 2, "min_count": 0,
                         "max_count": 2, "max_num_seqs": 2, "exec_model": "llama-2-7b-a30"}])
    stack = start_stack(1, fleet=Settings(fleet=fleet).fleet, engine_kind="emulated",
                        emulated_time_scale=0.5, routing_policy="round_robin",
                        max_batch_in_flight=8, engine_concurrency=64, autoscale=True)
    autoscaler = StackAutoscaler(stack, stack.settings)
    try:
        with stack.client(timeout=60) as client:
            ids = [submit(client, model=MODEL, prompt=f"Long answer {i}", max_tokens=120,
                          ignore_eos=True) for i in range(16)]

            def waiting_on_gpu1() -> bool:
                data = client.get("/v1/instances").json()["data"]
                return any(i["id"] == "gpu.1" and i["waiting"] > 0 for i in data)

            _until(waiting_on_gpu1, 60, "a backlog on gpu.1")
            autoscaler.drain("gpu.1")

            def stopped() -> bool:
                autoscaler.follow()
                return autoscaler.slots["gpu.1"].phase == "stopped"

            _until(stopped, 120, "gpu.1 drained and stopped")
            results = wait_terminal(client, ids)
            events = {i: client.get(f"/v1/requests/{i}").json()["events"] for i in ids}
        assert Counter(r["status"] for r in results.values()) == {"succeeded": 16}
        requeued = [i for i, evs in events.items()
                    if any("draining" in (e.get("detail") or "") for e in evs)]
        assert requeued, "no waiting request went back to routing"
        assert all(results[i]["instance_id"] == "gpu.0" for i in requeued)
        for evs in events.values():
            assert sum(1 for e in evs if e["status"] == "succeeded") == 1
    finally:
        autoscaler.stop()
