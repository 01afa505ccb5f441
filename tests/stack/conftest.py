"""Fixtures of the stack tests: the whole local stack started as processes, stopped after."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from app.cli.stack import Stack
from app.settings import Settings


def pytest_itemcollected(item: pytest.Item) -> None:
    """Every test in this folder starts the whole stack, on the real PostgreSQL and Redis."""
    item.add_marker("stack")
    item.add_marker("services")


@pytest.fixture(scope="session")
def inherited_env() -> dict[str, str]:
    """Our environment without BLOCKQ_* (the settings give those), for the stack's processes."""
    return {key: value for key, value in os.environ.items() if not key.startswith("BLOCKQ_")}


@pytest.fixture
def start_stack(
    fresh_services: Settings, inherited_env: dict[str, str]
) -> Iterator[Callable[..., Stack]]:
    """Starts a stack of `num_instances` engine workers (settings overridable), waits until it is
    ready; every stack started is stopped after the test."""
    stacks: list[Stack] = []

    def start(num_instances: int, **overrides: Any) -> Stack:
        settings = fresh_services.model_copy(
            update={
                "num_instances": num_instances,
                "api_workers": 1,
                "heartbeat_ttl_s": 2.0,
                "orphan_check_interval_s": 1.0,
                "webhook_backoff_s": 0.2,
                "engine_concurrency": 96,
                "kv_cache_gib": 0.5,
                **overrides,
            }
        )
        stack = Stack(settings, env={**inherited_env, **settings.as_env()})
        stacks.append(stack)
        stack.start()
        stack.wait_ready(num_instances=num_instances)
        return stack

    yield start
    for stack in stacks:
        stack.stop()
