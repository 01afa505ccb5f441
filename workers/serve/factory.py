"""Build the engine host of one instance from Settings, for the configured engine kind."""

from __future__ import annotations

from app.settings import Settings
from workers import runtime
from workers.serve.engine import Engine, EngineListener
from workers.serve.host import EngineHost

__all__ = ["build_engine_host"]


def build_engine_host(instance_id: str, settings: Settings) -> EngineHost:
    if settings.engine_kind != "vllm":
        raise SystemExit(f"engine kind {settings.engine_kind!r} is not available yet")
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

    return EngineHost(instance_id, make_engine, runtime.get())
