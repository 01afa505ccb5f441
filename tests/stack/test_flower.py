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

    url = f"http://{user}:{password}@{stack.settings.api_host}:{stack.settings.flower_port}"
    dom = _chromium("--dump-dom", f"{url}/workers")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / "flower-workers.png"
    _chromium(f"--screenshot={screenshot}", f"{url}/workers")

    for worker in ("gpu.0@", "gpu.1@", "predict@", "route@"):
        assert worker in dom, worker
    assert screenshot.stat().st_size > 10_000
