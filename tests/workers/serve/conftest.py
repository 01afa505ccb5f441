"""Fixtures for the serve tests: the tiny model, built once, one running vLLM engine, listeners."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from benchmarks.artifacts.tiny_model import build_tiny_model
from tests.workers.serve.recording import RecordingListener
from workers.serve.emulated_engine import EmulatedEngine, EmulatedEngineConfig
from workers.serve.output_lengths import MaxTokensLengths


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "stops_vllm: stops a vLLM engine, so it runs after every other test")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that stop a vLLM engine run last.

    NOTE: a vLLM engine's shutdown tears down vLLM's process-wide state (its parallel groups):
    no vLLM engine can step in this process afterwards, the session's included.
    """
    last = [item for item in items if item.get_closest_marker("stops_vllm")]
    items[:] = [item for item in items if not item.get_closest_marker("stops_vllm")] + last


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight Llama, as scripts/build_tiny_model.py builds it (a few seconds)."""
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def engine_listener() -> RecordingListener:
    """The listener of the session's vLLM engine."""
    return RecordingListener()


@pytest.fixture
def recorder() -> RecordingListener:
    """A fresh listener, for an engine of one test."""
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


#: Emulated engines in the tests run 100 times faster than real time.
EMULATED_FAST = 0.01


@pytest.fixture
def make_emulated_engine(recorder: RecordingListener) -> Iterator[Callable[..., EmulatedEngine]]:
    """Starts emulated engines (fast, no step noise, max_tokens lengths; config overridable),
    stopped after the test."""
    engines: list[EmulatedEngine] = []

    def make(**overrides: object) -> EmulatedEngine:
        config = EmulatedEngineConfig(**{"time_scale": EMULATED_FAST, "noise": 0.0,
                                         "output_lengths": MaxTokensLengths(), **overrides})
        engine = EmulatedEngine(config, recorder)
        engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()
