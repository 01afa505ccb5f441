"""`StackAutoscaler.start_instance`: the operator's (and the chaos harness's) hook that starts
one stopped slot now, as a scale-up does; a live slot is refused. And the scale-down hold an
autoscaler that died mid-drain leaves, released by the next one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli.autoscaler import StackAutoscaler
from domain.controls import SCALING_DOWN, OperatorControls
from domain.settings import Settings

pytestmark = pytest.mark.services

FLEET = json.dumps([{"model": "chat", "count": 1, "min_count": 1, "max_count": 2,
                     "engine": "emulated", "exec_model": "llama-2-7b-a30"}])


class _Stack:
    """What the autoscaler asks of the stack when it starts a slot."""

    def __init__(self, log_dir: Path) -> None:
        self.started: list[tuple[str, list[str]]] = []
        self.log_dir = log_dir

    def start_process(self, name: str, command: list[str]) -> None:
        self.started.append((name, command))

    def restart_count(self, name: str) -> int:
        return 0

    def release(self, name: str) -> None:
        """The stack lets a drained engine go (none runs here)."""


def test_a_stopped_slot_starts_now_and_a_live_one_is_refused(fresh_services: Settings,
                                                              tmp_path: Path) -> None:
    settings = fresh_services.model_copy(update={"fleet": Settings(fleet=FLEET).fleet,
                                                 "autoscale": True})
    stack = _Stack(tmp_path)
    scaler = StackAutoscaler(stack, settings)  # type: ignore[arg-type]
    try:
        OperatorControls(scaler.db, scaler.fleet).hold("gpu.1", "drained")  # an old drain
        assert scaler.redis.get("blockq:instance:gpu.1:control") == b"drained"
        scaler.start_instance("gpu.1")
        assert [name for name, _ in stack.started] == ["gpu.1"]
        assert "gpu.1" in stack.started[0][1]  # its own queue
        assert scaler.slots["gpu.1"].phase == "starting"
        assert scaler.redis.get("blockq:instance:gpu.1:control") is None  # takes work once up
        with pytest.raises(ValueError, match="gpu.0 is running"):
            scaler.start_instance("gpu.0")
        with pytest.raises(ValueError, match="gpu.1 is starting"):
            scaler.start_instance("gpu.1")
    finally:
        scaler.db.dispose()


def test_a_scale_down_hold_left_by_a_dead_autoscaler_is_released_and_an_operators_kept(
        fresh_services: Settings, tmp_path: Path) -> None:
    """The supervisor died mid-drain of gpu.0: the stack started again runs gpu.0 (among the
    entry's first `count`), so its hold must go, or no router would choose it while the
    autoscaler counts it as capacity. An operator's drain of gpu.1 is not the autoscaler's."""
    settings = fresh_services.model_copy(update={"fleet": Settings(fleet=FLEET).fleet,
                                                 "autoscale": True})
    first = StackAutoscaler(_Stack(tmp_path), settings)  # type: ignore[arg-type]
    try:
        first.drain("gpu.0")  # then the supervisor dies, and the autoscaler with it
        assert first.controls.held() == {"gpu.0": SCALING_DOWN}
        first.controls.hold("gpu.1", "drained")
    finally:
        first.db.dispose()

    again = StackAutoscaler(_Stack(tmp_path), settings)  # type: ignore[arg-type]
    try:
        assert again.controls.held() == {"gpu.1": "drained"}
        assert again.redis.get("blockq:instance:gpu.0:control") is None
        assert again.redis.get("blockq:instance:gpu.1:control") == b"drained"
        assert again.slots["gpu.0"].phase == "running"
    finally:
        again.db.dispose()
