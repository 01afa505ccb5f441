"""Build the engine host of one instance from Settings, for the configured engine kind."""

from __future__ import annotations

import zlib
from collections.abc import Callable

from app.settings import Settings
from workers import runtime
from workers.serve.emulated_engine import (
    AnswerLengths,
    EmulatedEngine,
    EmulatedEngineConfig,
    MaxTokensLengths,
    OutputLengths,
    ShareGptLengths,
)
from workers.serve.engine import Engine, EngineListener
from workers.serve.host import EngineHost

__all__ = ["build_engine_host"]

#: Block size of an emulated instance when Settings.block_size is unset (vLLM's GPU default).
EMULATED_DEFAULT_BLOCK_SIZE = 16


def build_engine_host(instance_id: str, settings: Settings) -> EngineHost:
    builders = {"vllm": _vllm_engine_factory, "emulated": _emulated_engine_factory}
    if settings.engine_kind not in builders:
        raise SystemExit(
            f"unknown engine kind {settings.engine_kind!r}; known: {sorted(builders)}"
        )
    make_engine = builders[settings.engine_kind](instance_id, settings)
    return EngineHost(instance_id, make_engine, runtime.get())


def _vllm_engine_factory(
    instance_id: str, settings: Settings
) -> Callable[[EngineListener], Engine]:
    from workers.serve.vllm_engine import VllmEngine, VllmEngineConfig  # noqa: PLC0415 - heavy

    config = VllmEngineConfig(
        model=str(settings.resolved_model_path),
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_model_len=settings.max_model_len,
        block_size=settings.block_size,
        kv_cache_gib=settings.kv_cache_gib,
        num_threads=settings.engine_threads,
    )

    def make_engine(listener: EngineListener) -> Engine:
        return VllmEngine(config, listener=listener)

    return make_engine


def _emulated_engine_factory(
    instance_id: str, settings: Settings
) -> Callable[[EngineListener], Engine]:
    """An emulated instance counting prompt tokens with the served model's tokenizer, as the API
    does, so that the API's context check and the engine agree."""
    prompts = runtime.get().prompts
    prompts.warm_up()
    lengths = _output_lengths(settings)
    config = EmulatedEngineConfig(
        exec_model=settings.emulated_exec_model,
        model=f"emulated/{settings.model_name}",
        num_blocks=settings.emulated_num_blocks,
        block_size=settings.block_size or EMULATED_DEFAULT_BLOCK_SIZE,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_model_len=settings.max_model_len,
        time_scale=settings.emulated_time_scale,
        noise=settings.emulated_noise,
        # Instances differ in their noise, not in their requests' lengths.
        seed=zlib.crc32(instance_id.encode()),
        output_lengths=lengths,
        count_tokens=prompts.count,
    )

    def make_engine(listener: EngineListener) -> Engine:
        return EmulatedEngine(config, listener=listener)

    return make_engine


def _output_lengths(settings: Settings) -> OutputLengths:
    if settings.emulated_output_lengths == "max_tokens":
        return MaxTokensLengths()
    if settings.emulated_output_lengths == "answers":
        if settings.emulated_answers_path is None:
            raise ValueError("emulated_output_lengths 'answers' needs emulated_answers_path")
        return AnswerLengths.from_jsonl(settings.emulated_answers_path)
    return ShareGptLengths()
