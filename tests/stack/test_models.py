"""Two models on one fleet, on real vLLM engines: a stack declared with BLOCKQ_FLEET serving two
tiny models of different architectures (tiny-llama twice, tiny-qwen once) answers each model
only from that model's instances, lists both in /v1/models, answers 404 for a third model, and
runs a batch for one model on that model's instances only. The official `openai` client."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from app.cli.stack import Stack
from benchmarks.artifacts.tiny_model import build_tiny_model
from workers.sim.fleet_declaration import parse_fleet

pytestmark = pytest.mark.slow

LLAMA, QWEN = "tiny-llama", "tiny-qwen"
LLAMA_INSTANCES, QWEN_INSTANCES = {"gpu.0", "gpu.1"}, {"gpu.2"}


@pytest.fixture(scope="module")
def qwen_path(model_path: Path) -> Path:
    """The tiny Qwen2 beside the tiny Llama (scripts/setup.sh builds it; built here if not)."""
    return Path(build_tiny_model(model_path.parent / QWEN, arch="qwen2"))


def _client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key=stack.api_key,
                         _strict_response_validation=True, max_retries=0, timeout=120)


def _native(stack: Stack, request_id: str) -> dict:
    with stack.client() as client:
        return client.get(f"/v1/requests/{request_id}").json()


def test_each_model_is_served_only_by_its_own_instances(
        start_stack: Callable[..., Stack], qwen_path: Path) -> None:
    fleet = json.dumps([{"model": LLAMA, "count": 2},
                        {"model": QWEN, "model_path": str(qwen_path)}])
    stack = start_stack(3, fleet=tuple(parse_fleet(fleet)), routing_policy="least_requests")
    client = _client(stack)

    with stack.client() as http:
        instances = {i["id"]: i for i in http.get("/v1/instances").json()["data"]}
    assert {i: (v["model"], v["engine_kind"], v["hardware"]) for i, v in instances.items()} == {
        "gpu.0": (LLAMA, "vllm", "cpu"), "gpu.1": (LLAMA, "vllm", "cpu"),
        "gpu.2": (QWEN, "vllm", "cpu")}
    assert instances["gpu.2"]["model_path"] == str(qwen_path.resolve())
    assert sorted(m.id for m in client.models.list().data) == [LLAMA, QWEN]
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="tiny-mistral", prompt="Hello", max_tokens=2)
    assert missing.value.code == "model_not_found"

    served: dict[str, set[str]] = {LLAMA: set(), QWEN: set()}
    for round_ in range(4):
        for model in (LLAMA, QWEN):
            raw = client.completions.with_raw_response.create(
                model=model, prompt=f"Tell me about queues, part {round_}.", max_tokens=4)
            assert raw.parse().model == model
            native = _native(stack, raw.headers["x-request-id"])
            assert native["status"] == "succeeded" and native["model"] == model
            served[model].add(native["instance_id"])
    chat = client.chat.completions.with_raw_response.create(
        model=QWEN, max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    served[QWEN].add(_native(stack, chat.headers["x-request-id"])["instance_id"])
    assert served[QWEN] == QWEN_INSTANCES
    assert served[LLAMA] and served[LLAMA] <= LLAMA_INSTANCES

    lines = [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": QWEN, "prompt": f"Batch line {i}", "max_tokens": 3}}
             for i in range(6)]
    file = client.files.create(file=("input.jsonl", "".join(
        json.dumps(line) + "\n" for line in lines).encode()), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/completions",
                                  completion_window="24h")
    assert batch.model == QWEN
    deadline = time.monotonic() + 180
    while (batch := client.batches.retrieve(batch.id)).status != "completed":
        assert batch.status in ("validating", "in_progress", "finalizing"), batch.to_json()
        assert time.monotonic() < deadline, batch.to_json()
        time.sleep(0.5)
    assert batch.output_file_id is not None
    results = [json.loads(line)
               for line in client.files.content(batch.output_file_id).text.splitlines()]
    assert len(results) == 6 and all(r["response"]["status_code"] == 200 for r in results)
    ran_on = {_native(stack, r["response"]["request_id"])["instance_id"] for r in results}
    assert ran_on == QWEN_INSTANCES

    # Flower (each engine worker's configuration) and the metrics name each instance's model.
    assert _flower_models(stack) == {"gpu.0": LLAMA, "gpu.1": LLAMA, "gpu.2": QWEN}
    with stack.client() as http:
        metrics = http.get("/metrics").text
    for instance, model in (("gpu.0", LLAMA), ("gpu.2", QWEN)):
        assert any(line.startswith("blockq_engine_alive{") and f'instance_id="{instance}"' in line
                   and f'model="{model}"' in line and 'hardware="cpu"' in line
                   for line in metrics.splitlines()), (instance, model)


def _flower_models(stack: Stack) -> dict[str, str]:
    """Engine worker name -> the model its configuration declares, as Flower's API shows it."""
    user, password = stack.flower_basic_auth.split(":", 1)
    deadline = time.monotonic() + 60
    models: dict[str, str] = {}
    with httpx.Client(base_url=stack.flower_url, auth=(user, password), timeout=10) as client:
        while len(models) < 3 and time.monotonic() < deadline:
            try:
                workers = client.get("/api/workers", params={"refresh": "1"}).json()
            except (httpx.HTTPError, ValueError):
                workers = {}
            models = {name.split("@")[0]: info["conf"]["blockq_instance"]["model"]
                      for name, info in workers.items()
                      if "blockq_instance" in (info.get("conf") or {})}
            if len(models) < 3:
                time.sleep(1)
    return models
