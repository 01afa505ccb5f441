"""Engine kinds are a registry: Settings.engine_kind picks one, unknown kinds are refused."""

from __future__ import annotations

import pytest

from domain.settings import Settings
from workers.serve.engine import EngineListener
from workers.serve.factory import ENGINE_KINDS, VllmEngineBuilder, build_engine_host
from workers.serve.vllm_engine import VllmEngine


def test_every_settings_engine_kind_is_registered() -> None:
    assert ENGINE_KINDS.names() == ["emulated", "vllm"]


def test_an_unknown_engine_kind_stops_the_worker_naming_the_known_ones() -> None:
    settings = Settings.model_construct(engine_kind="tpu")
    with pytest.raises(SystemExit, match="unknown engine kind 'tpu'; known: emulated, vllm"):
        build_engine_host("gpu.0", settings)


def test_the_vllm_kind_builds_an_engine_from_settings_without_starting_it() -> None:
    settings = Settings(max_num_seqs=7, max_num_batched_tokens=64, max_model_len=256)
    engine = VllmEngineBuilder("gpu.0", settings)(EngineListener())
    assert isinstance(engine, VllmEngine) and not engine.alive
    assert (engine.config.max_num_seqs, engine.config.max_num_batched_tokens,
            engine.config.max_model_len) == (7, 64, 256)


def test_the_interactive_seat_reserve_reaches_the_engine_and_must_leave_a_seat() -> None:
    settings = Settings(max_num_seqs=7, max_num_batched_tokens=64, max_model_len=256,
                        engine_interactive_seats=2)
    assert VllmEngineBuilder("gpu.0", settings).config.num_interactive_seats == 2
    assert not VllmEngineBuilder("gpu.0", settings).config.batch_prefill_last
    assert VllmEngineBuilder("gpu.0", settings.model_copy(
        update={"engine_batch_prefill_last": True})).config.batch_prefill_last
    with pytest.raises(ValueError, match="num_interactive_seats"):
        VllmEngineBuilder("gpu.0", settings.model_copy(update={"engine_interactive_seats": 7}))
