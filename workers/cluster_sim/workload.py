"""Workloads for the cluster benchmark: request lengths and arrival times read from traces.

A `Workload` holds arrival times at a mean rate of one request per second; `arrival_times`
rescales them to any rate, so every rate replays the same requests in the same order (common
random numbers: curves over rate are smooth, and policies see identical inputs).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

__all__ = [
    "AZURE_CODE",
    "AZURE_CONV",
    "MOONCAKE_BLOCK_TOKENS",
    "MOONCAKE_CONV",
    "SHAREGPT",
    "ReplayPrompt",
    "Workload",
    "fit_to_model",
    "load_azure_trace",
    "load_length_trace",
    "load_mooncake_trace",
    "multi_turn_workload",
    "load_replay_prompts",
    "load_sharegpt_azure",
    "poisson_unit_arrivals",
    "replay_sequence",
    "replay_workload",
    "shared_prompt_workload",
]

#: Trace files, relative to the shared data directory.
SHAREGPT = Path("traces/vidur_opt_scheduler/sharegpt_val_10k_llama2.csv")
AZURE_CONV = Path("traces/azure/AzureLLMInferenceTrace_conv.csv")
AZURE_CODE = Path("traces/azure/AzureLLMInferenceTrace_code.csv")
MOONCAKE_CONV = Path("traces/mooncake/conversation_trace.jsonl")
#: Tokens per Mooncake hash id.
MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests in arrival order: lengths and arrival times at a mean rate of 1 per second."""

    name: str
    #: Arrival times (s) at a mean rate of one request per second, ascending, first at 0.
    unit_arrival_s: tuple[float, ...]
    num_prompt_tokens: tuple[int, ...]
    #: True output lengths (what the instances generate).
    num_output_tokens: tuple[int, ...]
    #: A real predictor's lengths for these requests (the `learned` predictor), if known.
    predicted_output_tokens: tuple[int, ...] | None = None
    #: Each prompt's prefix hashes (`workers.sim.SimRequest.prefix_hashes`), if known: one
    #: per `prefix_block_size` tokens; requests sharing leading hashes share that prefix.
    prefix_hashes: tuple[tuple[int, ...], ...] | None = None
    #: Tokens one prefix hash covers (the instances' ``InstanceConfig.prefix_block_size``).
    prefix_block_size: int = 0

    def __post_init__(self) -> None:
        n = len(self.unit_arrival_s)
        if self.prefix_hashes is not None and (len(self.prefix_hashes) != n
                                               or self.prefix_block_size <= 0):
            raise ValueError("prefix hashes: one tuple per request, and their block size")
        if not n or len(self.num_prompt_tokens) != n or len(self.num_output_tokens) != n:
            raise ValueError("a workload needs as many arrival times as lengths, at least one")
        predicted = self.predicted_output_tokens
        if predicted is not None and (len(predicted) != n or min(predicted) < 1):
            raise ValueError("predicted lengths: one positive length per request")
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
        predicted = self.predicted_output_tokens
        hashes = self.prefix_hashes
        return Workload(self.name, _unit_rate(times), self.num_prompt_tokens[:num_requests],
                        self.num_output_tokens[:num_requests],
                        None if predicted is None else predicted[:num_requests],
                        None if hashes is None else hashes[:num_requests],
                        self.prefix_block_size)

    def prefix_hashes_of(self, index: int) -> tuple[int, ...]:
        """The `index`-th request's prefix hashes (none when the workload has none)."""
        return () if self.prefix_hashes is None else self.prefix_hashes[index]

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


def load_sharegpt_azure(lengths_path: str | Path, arrivals_path: str | Path, *,
                        max_model_len: int, num_requests: int | None = None) -> Workload:
    """ShareGPT lengths (file order) with an Azure trace's arrival times (bursts and lulls).

    The i-th request has the i-th fitted ShareGPT lengths and the i-th arrival of the Azure
    trace, rescaled to a mean rate of one; as many requests as the shorter of the two holds.
    """
    lengths = load_length_trace(lengths_path, max_model_len=max_model_len)
    arrivals = load_azure_trace(arrivals_path, max_model_len=max_model_len)
    n = min(len(lengths), len(arrivals))
    if num_requests is not None:
        n = min(n, num_requests)
    return Workload("sharegpt-azure", _unit_rate(arrivals.unit_arrival_s[:n]),
                    lengths.num_prompt_tokens[:n], lengths.num_output_tokens[:n])


@dataclass(frozen=True, slots=True)
class ReplayPrompt:
    """One row of a replay workload (``scripts/make_live_workload.py`` writes them).

    A real prompt held out from the length model's training, with one real answer's length.
    """

    prompt: str
    #: The model whose real answer gave `output_tokens`.
    source_model: str
    #: The real answer's length (Qwen tokens): the true length an emulated engine generates.
    output_tokens: int
    #: Prompt tokens as the emulated fleet counts them (the served model's tokenizer).
    prompt_tokens: int
    #: The held-out length model's prediction for this prompt and the serving model name.
    predicted_tokens: int

    FIELDS: ClassVar[tuple[str, ...]] = ("prompt", "source_model", "output_tokens",
                                         "prompt_tokens", "predicted_tokens")

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise ValueError("a replay prompt needs a non-empty prompt text")
        for name in ("output_tokens", "prompt_tokens", "predicted_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @classmethod
    def from_dict(cls, raw: dict) -> ReplayPrompt:
        missing = [name for name in cls.FIELDS if name not in raw]
        if missing:
            raise ValueError(f"replay row lacks {', '.join(missing)}")
        return cls(str(raw["prompt"]), str(raw["source_model"]), raw["output_tokens"],
                   raw["prompt_tokens"], raw["predicted_tokens"])

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.FIELDS}


def load_replay_prompts(path: str | Path) -> list[ReplayPrompt]:
    """The rows of a replay workload's ``requests.jsonl``, in file order.

    Raises ValueError naming the line of a malformed row; blank lines are skipped.
    """
    prompts = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                if not isinstance(raw, dict):
                    raise ValueError("not a JSON object")
                prompts.append(ReplayPrompt.from_dict(raw))
            except ValueError as error:  # json.JSONDecodeError is one
                raise ValueError(f"{path}:{number}: {error}") from None
    if not prompts:
        raise ValueError(f"{path}: no replay prompts")
    return prompts


def replay_sequence(prompts: Sequence[ReplayPrompt], num_requests: int,
                    seed: int = 0) -> list[ReplayPrompt]:
    """`num_requests` requests drawn from `prompts`: seeded shuffles, concatenated.

    Every prompt comes once before any comes twice (a prompt repeats only when `num_requests`
    exceeds the number of prompts); the live and the simulated benchmark call this with the same
    seed to replay the same request sequence.
    """
    if num_requests < 1 or not prompts:
        raise ValueError("need at least one prompt and one request")
    rng = np.random.default_rng([seed, 11])
    sequence: list[ReplayPrompt] = []
    while len(sequence) < num_requests:
        sequence += [prompts[i] for i in rng.permutation(len(prompts))]
    return sequence[:num_requests]


def replay_workload(prompts: Sequence[ReplayPrompt], *, num_requests: int, max_model_len: int,
                    seed: int = 0, name: str = "conversations") -> Workload:
    """Replay prompts as a workload: `replay_sequence` order, Poisson arrivals (`seed`).

    Lengths are fitted to the model as `fit_to_model` does (prompts of max_model_len tokens or
    more dropped, outputs capped); the held-out model's predictions ride along for the
    ``learned`` predictor, capped like the live predictor caps them (at the output room).
    """
    sequence = [p for p in replay_sequence(prompts, num_requests, seed)
                if p.prompt_tokens < max_model_len]
    if not sequence:
        raise ValueError(f"no replay prompt is shorter than max_model_len {max_model_len}")
    room = [max_model_len - p.prompt_tokens for p in sequence]
    return Workload(name, poisson_unit_arrivals(len(sequence), seed),
                    tuple(p.prompt_tokens for p in sequence),
                    tuple(min(p.output_tokens, r) for p, r in zip(sequence, room, strict=True)),
                    tuple(min(p.predicted_tokens, r)
                          for p, r in zip(sequence, room, strict=True)))


def load_mooncake_trace(path: str | Path, *, max_model_len: int,
                        num_requests: int | None = None) -> Workload:
    """A Mooncake trace (JSONL: ``timestamp`` ms, ``input_length``, ``output_length``,
    ``hash_ids``: the prompt's 512-token blocks' prefix hashes, shared ids = shared prefix).

    Keeps the real arrival pattern rescaled to a mean rate of one, and the hashes (block size
    `MOONCAKE_BLOCK_TOKENS`); requests vLLM would reject (prompt >= max_model_len) are dropped
    and outputs capped where vLLM stops them, as `fit_to_model` does.
    """
    times, prompts, outputs, hashes = [], [], [], []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            row = json.loads(line)
            prompt, output = int(row["input_length"]), int(row["output_length"])
            if 0 < prompt < max_model_len:
                times.append(float(row["timestamp"]) / 1000.0)
                prompts.append(prompt)
                outputs.append(max(1, min(output, max_model_len - prompt)))
                hashes.append(tuple(int(h) for h in row["hash_ids"]))
            if num_requests is not None and len(times) >= num_requests:
                break
    order = sorted(range(len(times)), key=times.__getitem__)
    return Workload(Path(path).stem, _unit_rate([times[i] for i in order]),
                    tuple(prompts[i] for i in order), tuple(outputs[i] for i in order),
                    prefix_hashes=tuple(hashes[i] for i in order),
                    prefix_block_size=MOONCAKE_BLOCK_TOKENS)


def shared_prompt_workload(base: Workload, *, num_prompts: int, prompt_tokens: int,
                           block_tokens: int, max_model_len: int, seed: int = 0) -> Workload:
    """`base`'s requests, each behind one of `num_prompts` shared system prompts.

    A request's prompt is a system prompt of `prompt_tokens` tokens, drawn with Zipf (s = 1)
    popularity, then its own `base` prompt (cut to fit `max_model_len`); its prefix hashes
    (one per `block_tokens`) are the system prompt's, shared, then its own.
    """
    rng = np.random.default_rng([seed, 15])
    weights = 1.0 / np.arange(1, num_prompts + 1)
    choices = rng.choice(num_prompts, size=len(base), p=weights / weights.sum())
    prompts, outputs, hashes = [], [], []
    for index, (own, output) in enumerate(zip(base.num_prompt_tokens, base.num_output_tokens,
                                              strict=True)):
        prompt = min(prompt_tokens + own, max_model_len - 1)
        system = int(choices[index])
        num_hashes = -(-prompt // block_tokens)
        shared = prompt_tokens // block_tokens
        hashes.append(tuple(system * 1_000 + u if u < shared else -(index * 1_000 + u) - 1
                            for u in range(num_hashes)))
        prompts.append(prompt)
        outputs.append(max(1, min(output, max_model_len - prompt)))
    return Workload(f"{base.name}-system-prompts", base.unit_arrival_s, tuple(prompts),
                    tuple(outputs), prefix_hashes=tuple(hashes), prefix_block_size=block_tokens)


def multi_turn_workload(base: Workload, *, mean_turns: float, mean_gap_requests: float,
                        block_tokens: int, max_model_len: int, seed: int = 0) -> Workload:
    """`base`'s lengths as the turns of multi-turn chats: each turn's prompt is the previous
    turn's prompt and answer, then a new message (`base`'s prompt lengths in order).

    Conversations have geometric turn counts (mean `mean_turns`), start as a Poisson process
    and space their turns by exponential gaps of mean `mean_gap_requests` unit-rate seconds
    (that many other arrivals in between, on average); arrivals are then rescaled to a mean
    rate of one. A chat ends early once its next prompt would not fit `max_model_len`. Prefix
    hashes (one per `block_tokens`) are shared by a conversation's turns up to the previous
    turn's full blocks.
    """
    rng = np.random.default_rng([seed, 16])
    messages = list(zip(base.num_prompt_tokens, base.num_output_tokens, strict=True))
    events: list[tuple[float, int, int, tuple[int, ...]]] = []
    start_s = next_message = chat = 0
    while next_message < len(messages):
        start_s += rng.exponential(mean_turns)
        at_s, context = start_s, 0
        turns = rng.geometric(1.0 / mean_turns)
        chat += 1
        for _ in range(turns):
            if next_message >= len(messages):
                break
            message, answer = messages[next_message]
            prompt = context + message
            if prompt >= max_model_len:
                break
            next_message += 1
            answer = max(1, min(answer, max_model_len - prompt))
            hashes = tuple(chat * 100_000 + u for u in range(-(-prompt // block_tokens)))
            events.append((at_s, prompt, answer, hashes))
            context = prompt + answer
            at_s += rng.exponential(mean_gap_requests)
        if not turns or context == 0 and next_message < len(messages):
            next_message += 1  # a first message that does not fit: skip it
    events.sort(key=lambda e: e[0])
    return Workload(f"{base.name}-chats", _unit_rate([e[0] for e in events]),
                    tuple(e[1] for e in events), tuple(e[2] for e in events),
                    prefix_hashes=tuple(e[3] for e in events), prefix_block_size=block_tokens)


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
