"""Flower beside the local stack, looked at the way an operator does: in a browser (headless
Chromium renders its workers page; the screenshot is kept as a test artifact)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx

from app.cli.stack import Stack
from tests.environment import ROOT
from tests.stack.native_requests import submit, wait_terminal

ARTIFACTS = Path(os.environ.get("BLOCKQ_TEST_ARTIFACTS", ROOT / ".blockq" / "test-artifacts"))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium(*args: str) -> str:
    assert CHROMIUM, "Debian's chromium is needed (scripts/setup.sh installs it)"
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--window-size=1400,900", "--virtual-time-budget=8000", *args],
                          capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


def _wait_for_workers(stack: Stack, auth: tuple[str, str], names: set[str]) -> None:
    """Until Flower's own API lists every worker (it learns them from their heartbeats)."""
    deadline = time.monotonic() + 60
    with httpx.Client(base_url=stack.flower_url, auth=auth, timeout=5) as client:
        while time.monotonic() < deadline:
            try:
                listed = client.get("/api/workers", params={"refresh": "1"}).json()
            except (httpx.HTTPError, ValueError):
                listed = {}
            if names <= {name.split("@")[0] for name in listed}:
                return
            time.sleep(1)
    raise AssertionError(f"Flower did not list {names} in time")


def test_flower_shows_every_worker_behind_basic_auth(emulated_stack: Stack) -> None:
    stack = emulated_stack  # two emulated instances, 20 times faster than real time
    user, password = stack.flower_basic_auth.split(":", 1)
    assert httpx.get(f"{stack.flower_url}/workers", timeout=5).status_code == 401
    _wait_for_workers(stack, (user, password), {"predict", "route", "gpu.0", "gpu.1"})

    url = f"http://{user}:{password}@{stack.settings.flower_host}:{stack.settings.flower_port}"
    dom = _chromium("--dump-dom", f"{url}/workers")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / "flower-workers.png"
    _chromium(f"--screenshot={screenshot}", f"{url}/workers")

    for worker in ("gpu.0@", "gpu.1@", "predict@", "route@"):
        assert worker in dom, worker
    assert screenshot.stat().st_size > 10_000


def _processed(stack: Stack, auth: tuple[str, str]) -> dict[str, int]:
    """Worker name (before '@') -> the Processed column of Flower's Workers page."""
    with httpx.Client(base_url=stack.flower_url, auth=auth, timeout=5) as client:
        rows = client.get("/workers", params={"json": "1"}).json()["data"]
    return {row["hostname"].split("@")[0]: int(row.get("task-received") or 0) for row in rows}


def test_flower_counts_the_engines_work(emulated_stack: Stack) -> None:
    """An operator opens Flower to see the GPU queues first: after serving requests, each engine
    worker's Processed count has risen by the requests it served."""
    stack = emulated_stack
    for name in ("gpu.0", "gpu.1"):  # from their start, not once Flower's broadcast reaches them
        assert "task events: ON" in (stack.log_dir / f"{name}.log").read_text(), name
    user, password = stack.flower_basic_auth.split(":", 1)
    _wait_for_workers(stack, (user, password), {"gpu.0", "gpu.1"})
    before = _processed(stack, (user, password))
    with stack.client() as client:
        ids = [submit(client, prompt=f"count to {i}", max_tokens=8) for i in range(8)]
        served = wait_terminal(client, ids, timeout_s=90)
    per_instance = {name: sum(1 for body in served.values() if body["instance_id"] == name)
                    for name in ("gpu.0", "gpu.1")}
    deadline = time.monotonic() + 15
    while True:  # the events reach Flower a moment after the requests end
        after = _processed(stack, (user, password))
        gained = {name: after.get(name, 0) - before.get(name, 0) for name in per_instance}
        if all(gained[name] >= per_instance[name] for name in per_instance):
            break
        assert time.monotonic() < deadline, (before, after, per_instance)
        time.sleep(1)
    assert sum(gained.values()) >= len(ids)
