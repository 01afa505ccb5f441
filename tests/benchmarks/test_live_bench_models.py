"""The live benchmark on a fleet of several models (issue 31, fleet (b)): each request names a
model, drawn with the run's seed by the declared shares; each model's instances keep their
model's name; each pool's latencies are reported on their own."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import threading
from pathlib import Path

import httpx
import pytest

from benchmarks.live import point
from benchmarks.live.models import (
    assign_models,
    fleet_models,
    parse_model_shares,
    split_by_model,
    stack_fleet,
)
from benchmarks.live.workloads import LiveRequest, LiveWorkload
from workers.sim.fleet_declaration import parse_fleet

FLEET_B = json.dumps([
    {"model": "llama-2-7b", "count": 2, "exec_model": "llama-2-7b-a100"},
    {"model": "llama-2-7b", "count": 6, "exec_model": "llama-2-7b-a30"},
    {"model": "llama-3-8b", "count": 2, "exec_model": "llama-3-8b-a100"},
])


def _workload(n: int) -> LiveWorkload:
    requests = [LiveRequest([16 + i], f"p{i}", 1, 10 + i, None, 100) for i in range(n)]
    return LiveWorkload("w", requests, [float(i) for i in range(n)], "tiny-llama", None,
                        learned_live=False, notes=[])


def test_shares_parse_and_normalise() -> None:
    assert parse_model_shares(["a=3", "b=1"]) == {"a": 0.75, "b": 0.25}
    assert list(parse_model_shares(["b=1", "a=1"])) == ["b", "a"]
    assert parse_model_shares([]) == {}
    for bad in (["a"], ["a=0"], ["=1"], ["a=x"], ["a=1", "a=2"], ["a=inf"]):
        with pytest.raises(ValueError):
            parse_model_shares(bad)


def test_each_request_names_a_model_by_a_seeded_draw() -> None:
    workload = _workload(4000)
    shares = {"llama-2-7b": 0.75, "llama-3-8b": 0.25}
    drawn = assign_models(workload, shares, seed=0)
    models = [r.model for r in drawn.requests]
    assert set(models) == set(shares)
    assert abs(models.count("llama-3-8b") / len(models) - 0.25) < 0.03
    # The same seed draws the same models; another seed others.
    assert [r.model for r in assign_models(workload, shares, seed=0).requests] == models
    assert [r.model for r in assign_models(workload, shares, seed=1).requests] != models
    # Requests, order and arrivals unchanged: each pool takes its share of one arrival process.
    assert [r.key for r in drawn.requests] == [r.key for r in workload.requests]
    assert drawn.unit_arrival_s == workload.unit_arrival_s
    assert all(r.model is None for r in workload.requests)
    assert "llama-3-8b" in drawn.notes[-1]


def test_a_fleet_of_several_models_keeps_each_model() -> None:
    specs = parse_fleet(FLEET_B)
    tokenizer = Path("models/tiny-llama")
    stacked = stack_fleet(specs, serving_model="tiny-llama", model_path=tokenizer)
    assert fleet_models(stacked) == ["llama-2-7b", "llama-3-8b"]
    assert [s.exec_model for s in stacked] == [s.exec_model for s in specs]
    assert all(s.engine == "emulated" and s.model_path == tokenizer for s in stacked)
    # One model: every instance serves the workload's model, as before.
    one = parse_fleet(json.dumps([{"model": "llama-2-7b", "count": 2,
                                   "exec_model": "llama-2-7b-a100"}]))
    assert fleet_models(stack_fleet(one, serving_model="tiny-llama",
                                    model_path=tokenizer)) == ["tiny-llama"]


def test_the_client_sends_each_request_s_model() -> None:
    workload = assign_models(_workload(20), {"a": 0.5, "b": 0.5}, seed=0)
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        return httpx.Response(202, json={"id": f"r{len(seen)}"})

    client = functools.partial(httpx.AsyncClient, transport=httpx.MockTransport(handler))
    original = point.httpx.AsyncClient
    point.httpx.AsyncClient = client
    try:
        asyncio.run(point._send("http://test", "key", workload, 1000.0, threading.Event()))
    finally:
        point.httpx.AsyncClient = original
    by_prompt = {tuple(b["prompt"]): b.get("model") for b in seen}
    assert by_prompt == {tuple(r.prompt): r.model for r in workload.requests}


def test_each_pool_is_summarised_on_its_own() -> None:
    models = ["a", "b", "a", "b", "a"]
    ttft = [0.8, 8.0, 1.6, 16.0, math.inf]  # wall s at time scale 8
    e2e = [8.0, 80.0, 16.0, 160.0, math.inf]
    pools = split_by_model(models, ttft, e2e, 8.0)
    assert pools["a"]["requests"] == 3 and pools["b"]["requests"] == 2
    assert pools["b"]["ttft_s"]["p50"] == pytest.approx(1.5)
    assert math.isinf(pools["a"]["ttft_s"]["p99"])
    assert split_by_model([None, None], [1.0, 1.0], [1.0, 1.0], 8.0) == {}
