"""The online loop in the running stack: history rows, hot reload of a promoted length model in
the predictor worker, and the bias watch's round-robin fallback in records and /v1/instances."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable

import httpx
from sqlalchemy import select

from app.cli.stack import Stack
from domain import model_registry as registry
from domain.db import Database
from domain.models import RequestOutcome
from tests.stack.native_requests import submit, wait_terminal
from workers.predict.length_model import LengthHead, bootstrap_artifact


def _wave(client: httpx.Client, first: int, count: int) -> dict[str, dict]:
    # NOTE: max_tokens far above the answers, so that no cap makes a prediction exact.
    ids = [submit(client, prompt=f"Question {i}: explain how {i} queues work, in detail.",
                  max_tokens=1500 + i) for i in range(first, first + count)]
    return wait_terminal(client, ids)


def _outcomes(stack: Stack) -> dict[str, RequestOutcome]:
    db = Database(stack.settings.resolved_database_url)
    try:
        with db.session() as session:
            return {o.request_id: o for o in session.scalars(select(RequestOutcome))}
    finally:
        db.dispose()


def _promote_renamed_bootstrap(stack: Stack, version: str) -> None:
    head = dataclasses.replace(LengthHead.load(bootstrap_artifact()), version=version)
    db = Database(stack.settings.resolved_database_url)
    try:
        with db.session() as session:
            row = registry.register(session, kind=registry.KIND_LENGTH,
                                    scope=stack.settings.model_name, artifact=head.to_bytes(),
                                    training_rows=0, metrics={})
            registry.promote(session, row)
    finally:
        db.dispose()


def test_history_hot_reload_and_fallback_in_the_running_stack(
    start_stack: Callable[..., Stack],
) -> None:
    stack = start_stack(
        2, engine_kind="emulated", emulated_time_scale=0.05, routing_policy="block",
        model_reload_interval_s=0.5,
        # Every prediction that is not exact counts as a miss: the fallback must start.
        bias_threshold=1e-9, bias_window=5, bias_fallback_s=60.0,
        learn_min_rows=10_000,  # the retrain the fallback asks for finds too little history
    )
    with stack.client() as client:
        first = _wave(client, 0, 10)
        routing_after_misses = client.get("/v1/instances").json()["routing"]
        second = _wave(client, 10, 6)
        _promote_renamed_bootstrap(stack, "hotreload01")
        time.sleep(1.5)  # > model_reload_interval_s
        third = _wave(client, 16, 4)

    results = {**first, **second, **third}
    assert Counter(r["status"] for r in results.values()) == {"succeeded": 20}

    # Every finished request has its history row: predicted and actual, lengths and latencies.
    outcomes = _outcomes(stack)
    assert set(outcomes) == set(results)
    for request_id, outcome in outcomes.items():
        request = results[request_id]
        assert outcome.output_tokens == request["output_tokens"]
        assert outcome.predicted_output_tokens == request["predicted_output_tokens"]
        assert outcome.instance_id == request["instance_id"]
        assert outcome.e2e_s > 0 and outcome.ttft_s is not None
        assert outcome.features["log_prompt_tokens"] > 0
    block_routed = [o for o in outcomes.values() if o.policy == "block"]
    assert block_routed and all(o.predicted_e2e_s is not None for o in block_routed)
    assert all(r["predicted_output_tokens"] <= r["predicted_output_tokens_p90"]
               for r in results.values())

    # The misses started the fallback: visible in /v1/instances and in the later records.
    assert routing_after_misses["configured_policy"] == "block"
    assert routing_after_misses["policy"] == "llumnix"
    assert "consecutive length predictions" in routing_after_misses["fallback"]["reason"]
    assert all(r["policy"] == "llumnix" and r["routing"]["fallback"]["model"]
               for r in second.values())

    # The predictor worker picked up the promoted version without a restart.
    bootstrap = LengthHead.load(bootstrap_artifact()).name
    assert {r["predictor"] for r in first.values()} == {bootstrap}
    assert {r["predictor"] for r in third.values()} == {"length_model:hotreload01"}
