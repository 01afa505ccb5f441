"""Fixtures for the serve tests: the tiny model, built once, and one running vLLM engine."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import pytest

from workers.serve.engine import EngineListener, StepSample

REPO_ROOT = Path(__file__).resolve().parents[3]


def _load_script(name: str):
    """Import a module from scripts/ (not a package) by path."""
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RecordingListener(EngineListener):
    """Keeps everything the engine reports, for assertions."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.steps: list[StepSample] = []
        self.first_tokens: dict[str, float] = {}
        self.deltas: dict[str, list[str]] = {}
        self.first_token_event: dict[str, threading.Event] = {}

    def event_for(self, request_id: str) -> threading.Event:
        with self.lock:
            return self.first_token_event.setdefault(request_id, threading.Event())

    def on_first_token(self, request_id: str, at: float) -> None:
        with self.lock:
            self.first_tokens[request_id] = at
        self.event_for(request_id).set()

    def on_tokens(self, request_id: str, delta_text: str) -> None:
        with self.lock:
            self.deltas.setdefault(request_id, []).append(delta_text)

    def on_step(self, sample: StepSample) -> None:
        with self.lock:
            self.steps.append(sample)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight Llama, built by scripts/build_tiny_model.py (a few seconds)."""
    builder = _load_script("build_tiny_model")
    return builder.build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def engine_listener() -> RecordingListener:
    return RecordingListener()


@pytest.fixture(scope="session")
def vllm_engine(tiny_model_dir: Path, engine_listener: RecordingListener):
    """One in-process vLLM engine for the whole session (a process holds one engine)."""
    pytest.importorskip("vllm")
    from workers.serve.vllm_engine import VllmEngine, VllmEngineConfig

    config = VllmEngineConfig(
        model=str(tiny_model_dir),
        block_size=32,  # vLLM's CPU attention needs a multiple of 32
        kv_cache_gib=0.25,
        max_num_seqs=48,
        max_num_batched_tokens=512,
        max_model_len=2048,
    )
    engine = VllmEngine(config, engine_listener)
    engine.start()
    yield engine
    engine.stop()
