"""An engine listener that records everything the engine reports, for assertions."""

from __future__ import annotations

import threading

from workers.serve.engine import EngineListener, StepSample

__all__ = ["RecordingListener"]


class RecordingListener(EngineListener):
    """Keeps everything the engine reports, for assertions."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.steps: list[StepSample] = []
        self.first_tokens: dict[str, float] = {}
        self.deltas: dict[str, list[str]] = {}

    def on_first_token(self, request_id: str, at: float) -> None:
        with self.lock:
            self.first_tokens[request_id] = at

    def on_tokens(self, request_id: str, delta_text: str) -> None:
        with self.lock:
            self.deltas.setdefault(request_id, []).append(delta_text)

    def on_step(self, sample: StepSample) -> None:
        with self.lock:
            self.steps.append(sample)
