"""Workloads for the cluster benchmark: request lengths and arrival times read from traces.

A `Workload` holds arrival times at a mean rate of one request per second; `arrival_times`
rescales them to any rate, so every rate replays the same requests in the same order (common
random numbers: curves over rate are smooth, and policies see identical inputs).
"""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "AZURE_CODE",
    "AZURE_CONV",
    "SHAREGPT",
    "Workload",
    "fit_to_model",
    "load_azure_trace",
    "load_length_trace",
    "poisson_unit_arrivals",
]

#: Trace files, relative to the shared data directory.
SHAREGPT = Path("traces/vidur_opt_scheduler/sharegpt_val_10k_llama2.csv")
AZURE_CONV = Path("traces/azure/AzureLLMInferenceTrace_conv.csv")
AZURE_CODE = Path("traces/azure/AzureLLMInferenceTrace_code.csv")


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests in arrival order: lengths and arrival times at a mean rate of 1 per second."""

    name: str
    #: Arrival times (s) at a mean rate of one request per second, ascending, first at 0.
    unit_arrival_s: tuple[float, ...]
    num_prompt_tokens: tuple[int, ...]
    #: True output lengths (what the instances generate).
    num_output_tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        n = len(self.unit_arrival_s)
        if not n or len(self.num_prompt_tokens) != n or len(self.num_output_tokens) != n:
            raise ValueError("a workload needs as many arrival times as lengths, at least one")
        if any(b < a for a, b in zip(self.unit_arrival_s, self.unit_arrival_s[1:], strict=False)):
            raise ValueError("arrival times must be ascending")
        if min(self.num_prompt_tokens) < 1 or min(self.num_output_tokens) < 1:
            raise ValueError("prompt and output lengths must be positive")

    def __len__(self) -> int:
        return len(self.unit_arrival_s)

    def arrival_times(self, rate: float) -> list[float]:
        """Arrival times at a mean rate of `rate` requests per second."""
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        return [t / rate for t in self.unit_arrival_s]

    def head(self, num_requests: int) -> Workload:
        """The first `num_requests` requests, times rescaled to a mean rate of one again."""
        if num_requests >= len(self):
            return self
        times = self.unit_arrival_s[:num_requests]
        return Workload(self.name, _unit_rate(times), self.num_prompt_tokens[:num_requests],
                        self.num_output_tokens[:num_requests])

    @property
    def mean_output_tokens(self) -> float:
        return sum(self.num_output_tokens) / len(self)


def poisson_unit_arrivals(num_requests: int, seed: int) -> tuple[float, ...]:
    """Poisson arrival times at rate 1 (first at 0), drawn with a fixed seed."""
    gaps = np.random.default_rng(seed).exponential(1.0, num_requests)
    gaps[0] = 0.0
    return tuple(np.cumsum(gaps).tolist())


def fit_to_model(prompts: Sequence[int], outputs: Sequence[int],
                 max_model_len: int) -> tuple[list[int], list[int]]:
    """Keep requests vLLM accepts; cap outputs where vLLM stops them (at max_model_len).

    NOTE: vLLM rejects a prompt of max_model_len tokens or more, so those are dropped
    rather than truncated; an output of 0 tokens still produces one.
    """
    kept_prompts, kept_outputs = [], []
    for prompt, output in zip(prompts, outputs, strict=True):
        if 0 < prompt < max_model_len:
            kept_prompts.append(prompt)
            kept_outputs.append(max(1, min(output, max_model_len - prompt)))
    return kept_prompts, kept_outputs


def load_length_trace(path: str | Path, *, max_model_len: int, num_requests: int | None = None,
                      seed: int = 0) -> Workload:
    """A length-only trace (``num_prefill_tokens, num_decode_tokens``) with Poisson arrivals."""
    with open(path, newline="") as handle:
        rows = [(int(r["num_prefill_tokens"]), int(r["num_decode_tokens"]))
                for r in csv.DictReader(handle)]
    prompts, outputs = fit_to_model([p for p, _ in rows], [d for _, d in rows], max_model_len)
    n = len(prompts) if num_requests is None else min(num_requests, len(prompts))
    return Workload(Path(path).stem, poisson_unit_arrivals(n, seed), tuple(prompts[:n]),
                    tuple(outputs[:n]))


def load_azure_trace(path: str | Path, *, max_model_len: int,
                     num_requests: int | None = None) -> Workload:
    """An Azure LLM inference trace (``TIMESTAMP, ContextTokens, GeneratedTokens``).

    Keeps the real arrival pattern (bursts and lulls), rescaled to a mean rate of one.
    """
    times, prompts, outputs = [], [], []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            prompt, output = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            if 0 < prompt < max_model_len:
                times.append(_seconds(row["TIMESTAMP"]))
                prompts.append(prompt)
                outputs.append(max(1, min(output, max_model_len - prompt)))
    order = sorted(range(len(times)), key=times.__getitem__)
    n = len(order) if num_requests is None else min(num_requests, len(order))
    order = order[:n]
    return Workload(Path(path).stem, _unit_rate([times[i] for i in order]),
                    tuple(prompts[i] for i in order), tuple(outputs[i] for i in order))


def _seconds(timestamp: str) -> float:
    """Seconds since the epoch of ``YYYY-MM-DD hh:mm:ss.fffffff`` (any fraction length)."""
    day, clock = timestamp.strip().split(" ")
    hours, minutes, seconds = clock.split(":")
    midnight = dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC).timestamp()
    return midnight + int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def _unit_rate(times: Sequence[float]) -> tuple[float, ...]:
    """`times` shifted to start at 0 and scaled to a mean rate of one request per second."""
    start = times[0]
    span = times[-1] - start
    if len(times) < 2 or span <= 0:
        return tuple(float(i) for i in range(len(times)))
    scale = (len(times) - 1) / span
    return tuple((t - start) * scale for t in times)
