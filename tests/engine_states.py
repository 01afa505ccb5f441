"""Published engine states for tests: an idle instance, changed where a test says."""

from __future__ import annotations

import dataclasses
from typing import Any

from workers.sim.engine_state import EngineState, RequestState

#: An idle emulated instance: the Block paper's A30 serving Qwen2-7B.
IDLE = EngineState(
    engine_kind="emulated", model="emulated/qwen2-7b-a30", num_running=0, num_waiting=0,
    num_total_blocks=7288, num_free_blocks=7288, block_size=16, max_num_seqs=48,
    max_num_batched_tokens=512, max_model_len=4096, requests=(), taken_at=0.0,
)


def engine_state(*requests: RequestState, **changes: Any) -> EngineState:
    """`IDLE` holding `requests`, with fields changed by keyword."""
    return dataclasses.replace(IDLE, requests=tuple(requests), **changes)


def waiting_request(request_id: str, num_prompt_tokens: int,
                    predicted_output_tokens: int | None) -> RequestState:
    """A request the engine holds but has not scheduled yet."""
    return RequestState(request_id, num_prompt_tokens, num_computed_tokens=0,
                        num_output_tokens=0, predicted_output_tokens=predicted_output_tokens,
                        is_running=False)
