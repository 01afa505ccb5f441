"""`blockq autoscale` (no stack: an orchestrator acts): each round reads the request history from
PostgreSQL and the heartbeats from Redis, and records the decision for GET /metrics."""

from __future__ import annotations

import json

import pytest

from app.cli.autoscaler import StackAutoscaler
from domain.autoscale_record import desired_instances
from domain.settings import Settings
from tests.app.flask_client import api_client

pytestmark = pytest.mark.services

FLEET = json.dumps([
    {"model": "chat", "count": 0, "min_count": 0, "max_count": 2, "engine": "emulated",
     "gpu_kind": "a100-80gb", "exec_model": "llama-2-7b-a100"},
    {"model": "bulk", "count": 1, "min_count": 1, "max_count": 1, "engine": "emulated",
     "gpu_kind": "a30", "exec_model": "llama-2-7b-a30"},
])


def test_a_request_waiting_at_zero_asks_for_an_instance(fresh_services: Settings) -> None:
    settings = fresh_services.model_copy(update={"fleet": Settings(fleet=FLEET).fleet,
                                                 "autoscale": True})
    client = api_client(settings)
    scaler = StackAutoscaler(None, settings)
    try:
        first = {d.model: d for d in scaler.step()}
        assert first["chat"].desired == {0: 0} and first["chat"].action == "hold"
        assert first["bulk"].desired == {1: 1}  # its min_count, no instance up: "up"
        accepted = client.post("/v1/requests", json={"model": "chat", "prompt": "Hi",
                                                     "max_tokens": 4})
        assert accepted.status_code == 202, accepted.get_data(as_text=True)
        woken = {d.model: d for d in scaler.step()}["chat"]
        assert woken.action == "up" and woken.desired == {0: 1}
        assert "1 waiting at zero" in woken.reason
        assert [(d.model, d.gpu_kind, d.count) for d in desired_instances(scaler.redis)] == [
            ("bulk", "a30", 1), ("chat", "a100-80gb", 1)]
    finally:
        scaler.stop()
