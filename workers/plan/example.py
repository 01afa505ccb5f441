"""The two-model workload of docs/planning.md: unlike work on one fleet.

- **chat** on Llama-2-7B: ShareGPT conversations' prompt and answer lengths (Llama-2 tokens)
  arriving as the Azure LLM inference trace's conversation service did (its bursts and lulls),
  under a tight time-to-first-token target: people wait for the first words.
- **bulk** on Llama-3-8B: the Azure trace's code service, lengths and arrivals (long prompts,
  mean about 2,000 tokens, and short completions, mean 28), under an end-to-end target: a tool
  waits for the whole answer.

Each keeps its trace's arrival pattern, rescaled to the rate asked for; both start at 0.
"""

from __future__ import annotations

from pathlib import Path

from workers.cluster_sim import (
    AZURE_CODE,
    AZURE_CONV,
    SHAREGPT,
    load_azure_trace,
    load_sharegpt_azure,
)

from .workload import PlanRequest

__all__ = ["CHAT_MODEL", "BULK_MODEL", "two_model_requests"]

CHAT_MODEL = "llama-2-7b"
BULK_MODEL = "llama-3-8b"
#: The context every kind runs with (workers.sim.hardware.MAX_MODEL_LEN).
MAX_MODEL_LEN = 4096


def two_model_requests(data_dir: Path, num_chat: int, chat_rate: float, num_bulk: int,
                       bulk_rate: float) -> list[PlanRequest]:
    """The requests in arrival order (module docstring); rates in requests per second."""
    chat = load_sharegpt_azure(data_dir / SHAREGPT, data_dir / AZURE_CONV,
                               max_model_len=MAX_MODEL_LEN, num_requests=num_chat)
    bulk = load_azure_trace(data_dir / AZURE_CODE, max_model_len=MAX_MODEL_LEN,
                            num_requests=num_bulk)
    requests = [PlanRequest(arrival_s=round(t / rate, 4), model=model, prompt_tokens=p,
                            output_tokens=o)
                for workload, model, rate in ((chat, CHAT_MODEL, chat_rate),
                                              (bulk, BULK_MODEL, bulk_rate))
                for t, p, o in zip(workload.unit_arrival_s, workload.num_prompt_tokens,
                                   workload.num_output_tokens, strict=True)]
    return sorted(requests, key=lambda r: (r.arrival_s, r.model))
