"""Fixtures of the stack tests: the whole local stack started as processes, stopped after.

Starting a stack (a dozen processes, the engines, the length model) is most of a stack test's
time, so tests whose settings agree share one: a shared-stack fixture (SHARED_STACKS) starts it
for the first test that asks, on a fresh database and Redis db, and keeps it for the next tests of
the same group; the collection order puts a group's tests together (those that leave the stack
unusable, marked `spends_stack`, last), and the stack is stopped after the group's last test, after
a test that failed, or when a process of it has exited. Tests with settings of their own call
`start_stack`, which starts a stack for that test alone.

The terminal summary lists every stack started (settings, start and stop seconds).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.cli.stack import Stack, StackError
from domain.settings import Settings

#: Settings of every stack the tests start, over the test services' settings.
TEST_STACK_SETTINGS: dict[str, Any] = {
    "api_workers": 1,
    "heartbeat_ttl_s": 2.0,
    "orphan_check_interval_s": 1.0,
    "webhook_backoff_s": 0.2,
    "kv_cache_gib": 0.5,
}

#: Shared-stack fixture name -> the stack's settings (over TEST_STACK_SETTINGS).
SHARED_STACKS: dict[str, dict[str, Any]] = {
    # Two emulated instances, 20 times faster than real time, round robin (the default), JSON
    # logs (the default; the log test reads them).
    "emulated_stack": {"num_instances": 2, "engine_kind": "emulated",
                       "emulated_time_scale": 0.05, "log_format": "json"},
    # The real vLLM engine with the tiny model: one instance, and two.
    "vllm_stack": {"num_instances": 1},
    "vllm_pair_stack": {"num_instances": 2},
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "spends_stack: leaves its shared stack unusable (killed processes, stopped "
        "consumers): runs last in its group, and the stack is stopped after it")


def pytest_itemcollected(item: pytest.Item) -> None:
    """Every test in this folder starts the whole stack, on the real PostgreSQL and Redis."""
    item.add_marker("stack")
    item.add_marker("services")


def shared_group(item: pytest.Item | None) -> str | None:
    """The shared stack a test uses, if any."""
    names = getattr(item, "fixturenames", ()) if item is not None else ()
    return next((name for name in SHARED_STACKS if name in names), None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests of each shared stack together, at the place of the first of them (those that
    spend the stack last); every other test keeps its place."""
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        group = shared_group(item)
        if group is not None:
            groups.setdefault(group, []).append(item)
    if not groups:
        return
    for members in groups.values():
        members.sort(key=lambda item: item.get_closest_marker("spends_stack") is not None)
    ordered: list[pytest.Item] = []
    for item in items:
        group = shared_group(item)
        if group is None:
            ordered.append(item)
        elif group in groups:
            ordered.extend(groups.pop(group))
    items[:] = ordered


@dataclass
class StackRecord:
    """One stack the tests started: for the terminal summary."""

    test: str
    settings: str
    start_s: float
    stop_s: float | None = None
    tests: int = 1


STARTED: list[StackRecord] = []


def _describe(num_instances: int, overrides: dict[str, Any]) -> str:
    return ", ".join([f"num_instances={num_instances}",
                      *(f"{key}={value!r}" for key, value in sorted(overrides.items()))])


def _start(settings: Settings, inherited_env: dict[str, str], test: str,
           description: str) -> tuple[Stack, StackRecord]:
    stack = Stack(settings, env={**inherited_env, **settings.as_env()})
    started = time.monotonic()
    record = StackRecord(test=test, settings=description, start_s=0.0)
    STARTED.append(record)
    try:
        stack.start()
        stack.wait_ready(num_instances=len(settings.initial_instance_ids))
    except BaseException:
        _stop(stack, record)
        raise
    record.start_s = time.monotonic() - started
    return stack, record


def _stop(stack: Stack, record: StackRecord) -> None:
    started = time.monotonic()
    stack.stop()
    record.stop_s = time.monotonic() - started


@pytest.fixture(scope="session")
def inherited_env() -> dict[str, str]:
    """Our environment without BLOCKQ_* (the settings give those), for the stack's processes."""
    return {key: value for key, value in os.environ.items() if not key.startswith("BLOCKQ_")}


@pytest.fixture
def start_stack(
    fresh_services: Settings, inherited_env: dict[str, str], request: pytest.FixtureRequest
) -> Iterator[Callable[..., Stack]]:
    """Starts a stack of `num_instances` engine workers (settings overridable), waits until it is
    ready; every stack started is stopped after the test."""
    stacks: list[tuple[Stack, StackRecord]] = []

    def start(num_instances: int, **overrides: Any) -> Stack:
        settings = fresh_services.model_copy(
            update={"num_instances": num_instances, **TEST_STACK_SETTINGS, **overrides})
        started = _start(settings, inherited_env, request.node.nodeid,
                         _describe(num_instances, overrides))
        stacks.append(started)
        return started[0]

    yield start
    for stack, record in stacks:
        _stop(stack, record)


@dataclass
class SharedStacks:
    """At most one running shared stack, kept for the next test of its group."""

    services: Callable[[Path], Settings]
    inherited_env: dict[str, str]
    tmp_path_factory: pytest.TempPathFactory
    current: tuple[str, Stack, StackRecord] | None = field(default=None)

    def get(self, group: str, test: str) -> Stack:
        if self.current is not None:
            name, stack, record = self.current
            if name == group and _healthy(stack):
                record.tests += 1
                return stack
            self.close()
        overrides = dict(SHARED_STACKS[group])
        num_instances = overrides.pop("num_instances")
        settings = self.services(self.tmp_path_factory.mktemp(group)).model_copy(
            update={"num_instances": num_instances, **TEST_STACK_SETTINGS, **overrides})
        stack, record = _start(settings, self.inherited_env, test,
                               f"{group}: {_describe(num_instances, overrides)}")
        self.current = (group, stack, record)
        return stack

    def close(self) -> None:
        if self.current is not None:
            _, stack, record = self.current
            self.current = None
            _stop(stack, record)


def _healthy(stack: Stack, timeout_s: float = 30.0) -> bool:
    """Every process of the stack still runs, and every engine instance is alive."""
    deadline = time.monotonic() + timeout_s
    with stack.client(timeout=5) as client:
        while True:
            try:
                stack.check_alive()
                instances = client.get("/v1/instances").json()["data"]
            except StackError:
                return False
            except (httpx.HTTPError, KeyError, ValueError):
                instances = []
            if sum(1 for i in instances if i["alive"]) == len(stack.settings.instance_ids):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)


_SHARED: list[SharedStacks] = []


@pytest.fixture(scope="session")
def shared_stacks(
    services_factory: Callable[[Path], Settings], inherited_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SharedStacks]:
    pool = SharedStacks(services_factory, inherited_env, tmp_path_factory)
    _SHARED.append(pool)
    yield pool
    pool.close()
    _SHARED.remove(pool)


@pytest.fixture
def emulated_stack(shared_stacks: SharedStacks, request: pytest.FixtureRequest) -> Stack:
    """The shared stack of two emulated instances (SHARED_STACKS)."""
    return shared_stacks.get("emulated_stack", request.node.nodeid)


@pytest.fixture
def vllm_stack(shared_stacks: SharedStacks, request: pytest.FixtureRequest) -> Stack:
    """The shared stack of one real vLLM engine with the tiny model."""
    return shared_stacks.get("vllm_stack", request.node.nodeid)


@pytest.fixture
def vllm_pair_stack(shared_stacks: SharedStacks, request: pytest.FixtureRequest) -> Stack:
    """The shared stack of two real vLLM engines with the tiny model."""
    return shared_stacks.get("vllm_pair_stack", request.node.nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed:
        item.stash[_FAILED] = True
    return report


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Stops a shared stack after the last test of its group, after a test that failed on it
    (the next starts a fresh one), and after a test that spends it."""
    result = yield
    group = shared_group(item)
    if group is not None and _SHARED and (
        shared_group(nextitem) != group or item.stash.get(_FAILED, False)
        or item.get_closest_marker("spends_stack") is not None
    ):
        _SHARED[0].close()
    return result


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not STARTED:
        return
    terminalreporter.section(f"stacks started: {len(STARTED)}")
    for record in STARTED:
        stop = f"{record.stop_s:.1f}" if record.stop_s is not None else "-"
        terminalreporter.write_line(
            f"start {record.start_s:6.1f} s  stop {stop:>6} s  tests {record.tests}  "
            f"{record.test}  [{record.settings}]")
