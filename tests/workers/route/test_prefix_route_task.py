"""Prefix-cache-aware routing through the real predict and route tasks (PostgreSQL, Redis): the
router hashes the new request's prompt tokens as engines hash theirs, finds which instance's
published cache holds its prefix, and block (the what-if credits the cached prefix) and
prefix_affinity send it there; without prefix caching the same fleet sends it elsewhere."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from domain.models import InferenceRequest
from tests.engine_states import engine_state
from tests.workers.request_rows import new_request
from workers.predict import tasks as predict_tasks
from workers.route import tasks as route_tasks
from workers.runtime import Runtime
from workers.serve.prefixes import PrefixMemory
from workers.sim.engine_state import RequestState
from workers.sim.snapshot import live_prefix_unit_tokens

UNIT = live_prefix_unit_tokens(16)
#: A long shared system prompt, then the user's question.
SYSTEM = "You are a careful assistant for the blockq project. " * 40


@pytest.fixture
def worker(configure_worker: Callable[..., Runtime]) -> Callable[..., Runtime]:
    def make(**overrides: Any) -> Runtime:
        return configure_worker(**{"length_predictor": "baseline", "engine_kind": "emulated",
                                   "heartbeat_ttl_s": 600.0,  # published states stay alive
                                   **overrides})

    return make


def _running(request_id: str, prompt: int = 200, output: int = 20) -> RequestState:
    return RequestState(request_id, prompt, prompt + output - 1, output, 300, True)


def _publish(rt: Runtime, held_ids: list[int]) -> None:
    """gpu.0 holds the prefix and is a little busier; gpu.1 is idle and holds nothing."""
    keys = PrefixMemory(UNIT, 10_000).keys_of(held_ids)
    assert len(keys) >= 8
    rt.fleet.publish("gpu.0", engine_state(_running("x1"), _running("x2"), num_running=2,
                                           prefix_unit_tokens=UNIT, cached_prefixes=keys))
    rt.fleet.publish("gpu.1", engine_state(prefix_unit_tokens=UNIT))


def _routed(rt: Runtime, request_id: str) -> InferenceRequest:
    with rt.db.session() as session:
        request = session.get(InferenceRequest, request_id)
        assert request is not None
        session.expunge(request)
        return request


@pytest.mark.parametrize(("policy", "in_predict"), [
    ("block", True), ("prefix_affinity", True), ("prefix_affinity", False)])
def test_a_text_prompt_goes_to_the_instance_holding_its_prefix(
        worker: Callable[..., Runtime], policy: str, in_predict: bool) -> None:
    rt = worker(routing_policy=policy, route_in_predict=in_predict)
    prompt = SYSTEM + "What is a KV cache?"
    _publish(rt, rt.prompts.token_ids(SYSTEM))  # an earlier request with the same system prompt
    with rt.db.session() as session:
        request_id = new_request(session, prompt=prompt, prompt_tokens=rt.prompts.count(prompt))

    predict_tasks.annotate(request_id)
    if not in_predict:
        route_tasks.route(request_id)

    row = _routed(rt, request_id)
    assert (row.instance_id, row.policy) == ("gpu.0", policy)
    if policy == "block":
        scores = row.routing["scores"]
        assert scores["gpu.0"] < scores["gpu.1"]


@pytest.mark.parametrize("policy", ["block", "prefix_affinity"])
def test_token_id_prompts_are_matched_on_their_ids_and_nothing_without_prefix_caching(
        worker: Callable[..., Runtime], policy: str) -> None:
    ids = [(7 * i) % 500 + 3 for i in range(1200)]
    for caching, expected in ((True, "gpu.0"), (False, "gpu.1")):
        rt = worker(routing_policy=policy, engine_prefix_caching=caching)
        _publish(rt, ids[:1100])
        with rt.db.session() as session:
            request_id = new_request(session, prompt="(token ids)", prompt_token_ids=ids,
                                     prompt_tokens=len(ids))
        predict_tasks.annotate(request_id)
        assert _routed(rt, request_id).instance_id == expected, caching
