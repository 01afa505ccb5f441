"""The requests the live benchmark replays, and the files the stack reads about them.

Two workloads (docs/benchmarks_live.md):

- "conversations": held-out real prompts with one real answer's length each
  (`scripts/make_live_workload.py` writes them; read with
  `workers.cluster_sim.workload.load_replay_prompts`), in `replay_sequence` order with Poisson
  arrivals, as the discrete-event benchmark replays them. The prompt is sent as text: the API and
  the emulated engine count it with the served model's tokenizer (Settings.model_path), so the
  live prompt lengths are that tokenizer's counts, recorded with each request.
- "sharegpt-azure": ShareGPT prompt/answer lengths with the Azure conversation trace's arrivals.
  Prompts are sent as token ids (random ids, the trace's count): the engine sees exactly the
  trace's prompt length; the table key is their text as the API decodes it. `block` gets the
  learned-errors noise model's lengths (workers/cluster_sim/predictors.py) through the table.
- "mooncake" (issue 15): the Mooncake conversation trace's lengths, arrival pattern and shared
  prefixes (requests whose prompt fits max_model_len). Prompts are token ids: each full 512-token
  block the trace hashes (``hash_ids``) is a sequence drawn from its hash alone, so requests that
  share leading hashes share those prompt tokens (and the engines' prefix cache serves them), and
  the rest of the prompt is the request's own. Lengths for block as for "sharegpt-azure".

Every request asks for the whole room (max_tokens = max_model_len - prompt tokens): the true
length comes from the emulated engine's answer table (Settings.emulated_output_lengths
'answers'), never from max_tokens, so predictions are capped only where the engine would stop.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workers.cluster_sim.workload import (
    AZURE_CONV,
    MOONCAKE_BLOCK_TOKENS,
    MOONCAKE_CONV,
    SHAREGPT,
    load_azure_trace,
    load_length_trace,
    load_mooncake_trace,
    load_replay_prompts,
    poisson_unit_arrivals,
    replay_sequence,
)

__all__ = ["LiveRequest", "LiveWorkload", "conversations", "mooncake", "mooncake_token_ids",
           "sharegpt_azure", "write_jsonl"]

#: Token ids below this are left out of generated prompts (the tokenizer's special tokens).
_FIRST_PLAIN_ID = 16


@dataclass(frozen=True, slots=True)
class LiveRequest:
    #: What is sent as `prompt`: text, or token ids.
    prompt: str | list[int]
    #: The prompt as the stack stores it (the prediction and answer tables' key).
    key: str
    #: Prompt tokens as the stack counts them.
    prompt_tokens: int
    #: The true output length: what the emulated engine generates.
    output_tokens: int
    #: The offline learned prediction (conversations: the held-out model's; sharegpt-azure: the
    #: learned-errors noise model's, when available), None if there is none.
    learned_tokens: int | None
    max_tokens: int
    #: The model the request names (a fleet of several models: `benchmarks.live.models`); None: the
    #: request names none (the stack's default model).
    model: str | None = None


@dataclass(frozen=True)
class LiveWorkload:
    name: str
    requests: list[LiveRequest]
    #: Arrival times at a mean rate of one per (emulated) second, one per request.
    unit_arrival_s: list[float]
    #: Settings.model_name of the fleet: the name the length model is asked for.
    serving_model: str
    #: The held-out length model (Settings.length_model_path) for the live learned predictor.
    length_model_path: Path | None
    #: True when `block` runs the learned model in the predict worker (else a table of
    #: `learned_tokens`, or no `block` at all when those are None).
    learned_live: bool
    notes: list[str]

    @property
    def mean_output_tokens(self) -> float:
        return statistics.fmean(r.output_tokens for r in self.requests)

    def answers_rows(self) -> list[dict[str, object]]:
        return [{"prompt": r.key, "output_tokens": r.output_tokens} for r in self.requests]

    def table_rows(self, mode: str) -> list[dict[str, object]]:
        """Prediction table of `mode`: oracle (true lengths), mean (the workload's mean output
        length for every request) or learned (the offline predictions)."""
        mean = max(1, round(self.mean_output_tokens))
        rows = []
        for r in self.requests:
            if mode == "oracle":
                tokens = r.output_tokens
            elif mode == "mean":
                tokens = mean
            elif mode == "learned" and r.learned_tokens is not None:
                tokens = r.learned_tokens
            else:
                raise ValueError(f"no {mode!r} predictions for workload {self.name}")
            rows.append({"prompt": r.key, "predicted_tokens": min(tokens, r.max_tokens)})
        return rows


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def conversations(workload_dir: Path, *, num_requests: int, max_model_len: int, seed: int,
                  count_tokens: Callable[[str], int]) -> LiveWorkload:
    """The held-out replay prompts of `workload_dir` (make_live_workload.py's output)."""
    manifest = json.loads((workload_dir / "manifest.json").read_text())
    rows = load_replay_prompts(workload_dir / "requests.jsonl")
    # NOTE: the discrete-event benchmark's order and arrivals (replay_workload): same seed, same
    # sequence; a prompt the live tokenizer finds too long leaves a gap, the others keep times.
    sequence = [p for p in replay_sequence(rows, num_requests, seed)
                if p.prompt_tokens < max_model_len]
    arrivals = poisson_unit_arrivals(len(sequence), seed)
    counts: dict[str, int] = {}
    requests, times, dropped = [], [], 0
    for row, at in zip(sequence, arrivals, strict=True):
        n = counts.get(row.prompt) or counts.setdefault(row.prompt, count_tokens(row.prompt))
        room = max_model_len - n
        if room < 1:
            dropped += 1
            continue
        requests.append(LiveRequest(row.prompt, row.prompt, n, min(row.output_tokens, room),
                                    min(row.predicted_tokens, room), room))
        times.append(at)
    notes = [f"{len(requests)} requests from {len({r.key for r in requests})} held-out prompts "
             f"(manifest: {manifest.get('num_replay_prompts')} replay prompts, seed "
             f"{manifest.get('seed')})"]
    if dropped:
        notes.append(f"{dropped} requests dropped: prompt too long for max_model_len "
                     f"{max_model_len} with the served tokenizer")
    model_file = manifest.get("model_path")
    model_path = workload_dir / model_file if model_file else None
    return LiveWorkload("conversations", requests, times,
                        str(manifest.get("serving_model", "tiny-llama")), model_path,
                        learned_live=model_path is not None, notes=notes)


def sharegpt_azure(data_dir: Path, *, num_requests: int, max_model_len: int, seed: int,
                   decode: Callable[[list[int]], str], vocab_size: int,
                   learned: Callable[[list[int]], list[int]] | None = None) -> LiveWorkload:
    """ShareGPT lengths, Azure conversation arrivals; prompts as random token ids.

    `learned(true_lengths)`: the learned-errors noise model's predictions, if available.
    """
    lengths = load_length_trace(data_dir / SHAREGPT, max_model_len=max_model_len,
                                num_requests=num_requests, seed=seed)
    arrivals = load_azure_trace(data_dir / AZURE_CONV, max_model_len=max_model_len,
                                num_requests=len(lengths)).unit_arrival_s
    n = min(len(lengths), len(arrivals))
    rng = random.Random(seed)
    predicted = (learned(list(lengths.num_output_tokens[:n])) if learned is not None
                 else [None] * n)
    requests, seen = [], set()
    for i in range(n):
        prompt_tokens, output_tokens = lengths.num_prompt_tokens[i], lengths.num_output_tokens[i]
        while True:
            ids = [rng.randrange(_FIRST_PLAIN_ID, vocab_size) for _ in range(prompt_tokens)]
            # as domain.commands stores it (NUL included: domain.models.ExactText)
            key = decode(ids)
            if key not in seen:
                break
        seen.add(key)
        room = max_model_len - prompt_tokens
        requests.append(LiveRequest(ids, key, prompt_tokens, output_tokens,
                                    predicted[i], room))
    notes = [f"{n} requests: ShareGPT lengths ({SHAREGPT.name}), Azure conversation arrivals "
             f"({AZURE_CONV.name}), prompts as random token ids"
             + ("; block's lengths: learned-errors draws" if learned is not None else "")]
    if learned is None:
        notes.append("no learned-errors noise model available: block (learned) not run")
    return LiveWorkload("sharegpt-azure", requests, list(arrivals[:n]), "tiny-llama", None,
                        learned_live=False, notes=notes)


def mooncake_token_ids(hash_ids: tuple[int, ...], num_prompt_tokens: int, own: str,
                       vocab_size: int) -> list[int]:
    """Prompt token ids sharing a prefix where the Mooncake hashes do: each full 512-token
    block a hash covers is drawn from that hash alone (the engines chain units, so an equal
    block after a different prefix still differs), the rest from `own` (the request's alone:
    at least one token, so that no two prompts are equal)."""
    num_blocks = min(len(hash_ids), (num_prompt_tokens - 1) // MOONCAKE_BLOCK_TOKENS)
    ids: list[int] = []
    for block_hash in hash_ids[:num_blocks]:
        rng = random.Random(f"mooncake-block:{block_hash}")
        ids += [rng.randrange(_FIRST_PLAIN_ID, vocab_size) for _ in range(MOONCAKE_BLOCK_TOKENS)]
    rng = random.Random(f"mooncake-own:{own}")
    ids += [rng.randrange(_FIRST_PLAIN_ID, vocab_size) for _ in range(num_prompt_tokens - len(ids))]
    return ids


def mooncake(data_dir: Path, *, num_requests: int, max_model_len: int, seed: int,
             decode: Callable[[list[int]], str], vocab_size: int,
             learned: Callable[[list[int]], list[int]] | None = None) -> LiveWorkload:
    """The Mooncake conversation trace's first `num_requests` requests that fit
    `max_model_len`, in trace order with its arrival pattern; prompts as token ids sharing the
    trace's prefixes (`mooncake_token_ids`)."""
    trace = load_mooncake_trace(data_dir / MOONCAKE_CONV, max_model_len=max_model_len,
                                num_requests=num_requests)
    n = len(trace)
    outputs = list(trace.num_output_tokens)
    predicted = learned(outputs) if learned is not None else [None] * n
    requests, seen, shared = [], set(), 0
    for i in range(n):
        prompt_tokens = trace.num_prompt_tokens[i]
        ids = mooncake_token_ids(trace.prefix_hashes_of(i), prompt_tokens, f"{seed}:{i}",
                                 vocab_size)
        key = decode(ids)  # as domain.commands stores it (NUL included: domain.models.ExactText)
        if key in seen:
            raise ValueError(f"mooncake request {i}: two prompts decode to the same text")
        seen.add(key)
        shared += min(len(trace.prefix_hashes_of(i)), (prompt_tokens - 1) // MOONCAKE_BLOCK_TOKENS)
        room = max_model_len - prompt_tokens
        requests.append(LiveRequest(ids, key, prompt_tokens, min(outputs[i], room),
                                    predicted[i], room))
    total = sum(r.prompt_tokens for r in requests)
    notes = [f"{n} requests of the Mooncake conversation trace ({MOONCAKE_CONV.name}) that fit "
             f"max_model_len {max_model_len}, its arrival pattern; prompts as token ids, "
             f"{shared * MOONCAKE_BLOCK_TOKENS / total:.0%} of prompt tokens in hashed "
             f"{MOONCAKE_BLOCK_TOKENS}-token blocks"
             + ("; block's lengths: learned-errors draws" if learned is not None else "")]
    if learned is None:
        notes.append("no learned-errors noise model available: block (learned) not run")
    return LiveWorkload("mooncake", requests, list(trace.unit_arrival_s), "tiny-llama", None,
                        learned_live=False, notes=notes)
