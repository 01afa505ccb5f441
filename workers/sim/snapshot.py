"""Instance snapshots as the simulator takes them, and their normalised form.

Engines publish `workers.sim.engine_state.EngineState`; its `to_instance_snapshot()` makes one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .batch_rules import PRIORITY_CLASS_SPAN_MS, is_batch_priority, is_late_batch_prefill
from .block_pool import chain_prefix_hashes

#: vLLM v1's scheduling policies: first come first served, or lowest priority value first.
SCHEDULING_POLICIES = ("fcfs", "priority")
#: Predicted-shortest-first's aging weight (see `request_priority`): a request predicted one
#: token longer than another is served as if it had arrived this many ms later.
DEFAULT_PRIORITY_MS_PER_TOKEN = 2.0
#: Live engines hash prompts in units of at least this many tokens (`live_prefix_unit_tokens`):
#: coarser than vLLM's block, so what an engine publishes of its cache stays small.
LIVE_PREFIX_UNIT_MIN_TOKENS = 64

__all__ = [
    "PRIORITY_CLASS_SPAN_MS",
    "InstanceConfig",
    "InstanceSnapshot",
    "OverrunPolicy",
    "PreparedInstance",
    "SeqSpec",
    "SimRequest",
    "normalise",
    "SCHEDULING_POLICIES",
    "engine_priority",
    "is_batch_priority",
    "is_late_batch_prefill",
    "live_prefix_unit_tokens",
    "matched_prefix_tokens",
    "prefix_keys",
    "prefix_unit_hashes",
    "prepare",
    "request_priority",
    "shared_prefix_blocks",
    "target_output_tokens",
]


@dataclass(frozen=True, slots=True)
class InstanceConfig:
    """The vLLM settings that shape one instance's schedule."""

    #: KV-cache blocks on the GPU (vLLM's ``num_gpu_blocks``; one is reserved, see
    #: `num_usable_blocks`).
    num_total_blocks: int
    #: Tokens per KV block.
    block_size: int
    #: Most requests in the running batch (``max_num_seqs``).
    max_num_seqs: int
    #: Token budget of one step (``max_num_batched_tokens``); chunked prefill is always on.
    max_num_batched_tokens: int
    #: Longest sequence (prompt + output) the instance accepts.
    max_model_len: int
    #: Fraction of blocks kept free when admitting waiting requests (vLLM ``watermark``).
    watermark: float = 0.0
    #: Whether cached prefix blocks are reused instead of recomputed.
    enable_prefix_caching: bool = False
    #: Admit a waiting request only if its whole input fits, not just its first chunk
    #: (vLLM ``scheduler_reserve_full_isl``, on by default).
    reserve_full_input: bool = True
    #: vLLM ``scheduling_policy``: "fcfs", or "priority" (waiting requests in (priority,
    #: arrival) order, and the running request with the largest one preempted first).
    scheduling_policy: str = "fcfs"
    #: Under "priority": the ms per predicted output token in each request's priority
    #: (`request_priority`); what-ifs need it to price expected future arrivals.
    priority_ms_per_token: float = DEFAULT_PRIORITY_MS_PER_TOKEN
    #: Tokens one of a request's prefix hashes (`SimRequest.prefix_hashes`) covers: the prefix
    #: cache's unit, a multiple of `block_size`; 0: one block (vLLM's own granularity).
    prefix_block_size: int = 0
    #: Under "priority": seats of `max_num_seqs` kept free for interactive requests. A waiting
    #: batch request (`is_batch_priority`) is admitted only while fewer than max_num_seqs -
    #: this many requests run (the engine holds it back otherwise), so that an interactive
    #: arrival finds a seat instead of waiting for a batch answer to end; and when a burst
    #: beyond the reserve leaves an interactive request heading the queue with every seat
    #: taken, the running batch request with the largest priority gives its seat up at the
    #: start of a step (preempted by recompute; one a step). 0: no reserve, no yielding.
    num_interactive_seats: int = 0
    #: Under "priority": each step, running batch-class requests with more than one token to
    #: compute (a prefill, or a recompute after preemption; `is_late_batch_prefill`) go after
    #: every other running request, and sit the step out (keeping their seats and blocks, not
    #: preemptible) while an interactive request waits, never two steps in a row (so that an
    #: interactive request that cannot be admitted stops no one): an interactive prefill takes
    #: the token budget before batch prefill chunks do (the engines treat vLLM's running list
    #: so).
    batch_prefill_last: bool = False

    def __post_init__(self) -> None:
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {SCHEDULING_POLICIES}, "
                             f"got {self.scheduling_policy!r}")
        if self.priority_ms_per_token < 0.0:
            raise ValueError("priority_ms_per_token must not be negative")
        for name in ("num_total_blocks", "block_size", "max_num_seqs",
                     "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # NOTE: vLLM refuses this too; the simulator relies on it (every running
            # decode fits in every step's budget).
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs")
        if self.num_usable_blocks * self.block_size < self.max_model_len:
            raise ValueError("the KV cache must hold at least one max_model_len sequence")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")
        if not 0 <= self.num_interactive_seats < self.max_num_seqs:
            raise ValueError("num_interactive_seats must be in [0, max_num_seqs), got "
                             f"{self.num_interactive_seats}")
        if self.prefix_block_size < 0 or self.prefix_block_size % self.block_size:
            raise ValueError("prefix_block_size must be 0 or a multiple of block_size, got "
                             f"{self.prefix_block_size}")

    @property
    def prefix_unit_tokens(self) -> int:
        """Tokens per prefix hash (one prefix-cache unit)."""
        return self.prefix_block_size or self.block_size

    @property
    def prefix_unit_blocks(self) -> int:
        """KV blocks per prefix hash."""
        return self.prefix_unit_tokens // self.block_size

    @property
    def num_usable_blocks(self) -> int:
        """Blocks requests can hold: vLLM's block pool keeps one back as its null block."""
        return self.num_total_blocks - 1

    @property
    def num_watermark_blocks(self) -> int:
        return int(self.watermark * self.num_total_blocks)

    @property
    def is_priority(self) -> bool:
        return self.scheduling_policy == "priority"


def request_priority(arrival_s: float, predicted_output_tokens: int | None,
                     ms_per_token: float = DEFAULT_PRIORITY_MS_PER_TOKEN) -> int:
    """Predicted-shortest-first's vLLM priority: a virtual deadline, smaller runs first.

    ``arrival in ms + ms_per_token * predicted output tokens``. Among requests that arrived
    together the shortest predicted goes first; a request predicted longer is overtaken
    only by requests arriving less than ``ms_per_token * (its length - theirs)`` ms after
    it, so it ages: nothing waits forever. vLLM priorities are integers (ms here).
    """
    return round(arrival_s * 1000.0) + round(ms_per_token * max(predicted_output_tokens or 0, 0))


def engine_priority(class_priority: int, arrival_s: float, predicted_output_tokens: int | None,
                    ms_per_token: float = DEFAULT_PRIORITY_MS_PER_TOKEN) -> int:
    """The vLLM priority an engine scheduling predicted-shortest-first gives a request: its
    class first (every interactive request before any batch one), then `request_priority`."""
    return (class_priority * PRIORITY_CLASS_SPAN_MS
            + request_priority(arrival_s, predicted_output_tokens, ms_per_token))


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request in a snapshot, or the new request being placed.

    A waiting request with output tokens was preempted: it recomputes them on resume.
    """

    request_id: str
    #: Prompt length in tokens.
    num_prompt_tokens: int
    #: Tokens whose KV is computed (0 for waiting requests).
    num_computed_tokens: int = 0
    #: Output tokens generated so far.
    num_output_tokens: int = 0
    #: Predicted total output length; ``None`` or 0 when no prediction exists.
    predicted_output_tokens: int | None = None
    #: Whether the request is in the running batch (else it waits).
    is_running: bool = False
    #: Prompt-prefix tokens already in this instance's prefix cache, in blocks other
    #: requests hold for longer than this one (a shared system prompt, say); used
    #: only with prefix caching on.
    num_cached_tokens: int = 0
    #: vLLM priority (smaller first) under the "priority" policy (`request_priority`).
    priority: int = 0
    #: Hashes of the prompt's blocks of ``config.prefix_unit_tokens`` tokens, in order
    #: (each block's own; `prefix_keys` chains them). With prefix caching on they replace
    #: `num_cached_tokens`: the simulated instance finds the prefix in its own cache.
    #: Empty: no prefix information (the request shares nothing it can find).
    prefix_hashes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_prompt_tokens <= 0:
            raise ValueError(f"{self.request_id}: num_prompt_tokens must be positive")
        if min(self.num_computed_tokens, self.num_output_tokens, self.num_cached_tokens) < 0:
            raise ValueError(f"{self.request_id}: token counts must not be negative")


@dataclass(frozen=True, slots=True)
class InstanceSnapshot:
    """One instance as the simulator takes it: config, free blocks, running and waiting
    requests (made from a published state by `EngineState.to_instance_snapshot`)."""

    config: InstanceConfig
    #: Free KV blocks (vLLM counts evictable cached blocks as free).
    num_free_blocks: int
    #: Requests in published order; running ones keep vLLM's running order.
    requests: tuple[SimRequest, ...] = ()
    #: Chained keys of the prefix units the instance's cache holds, in use or free (see
    #: `workers.sim.block_pool`): a router credits a new request's match (prefix caching).
    cached_prefixes: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if not 0 <= self.num_free_blocks <= self.config.num_usable_blocks:
            raise ValueError(f"num_free_blocks {self.num_free_blocks} outside "
                             f"[0, {self.config.num_usable_blocks}]")

    @property
    def running(self) -> tuple[SimRequest, ...]:
        return tuple(r for r in self.requests if r.is_running)

    @property
    def waiting(self) -> tuple[SimRequest, ...]:
        return tuple(r for r in self.requests if not r.is_running)


@dataclass(frozen=True, slots=True)
class OverrunPolicy:
    """Remaining length for a request that has already outrun its prediction.

    Output lengths are heavy-tailed, so a request past its prediction is expected to
    run on roughly in proportion to what it has produced: it gets
    ``max(min_margin_tokens, ceil(margin_fraction * generated))`` more tokens.
    """

    margin_fraction: float = 0.25
    min_margin_tokens: int = 8


class SeqSpec(NamedTuple):
    """A request normalised for simulation: consistent counts and a final length.

    NOTE: a named tuple, not a frozen dataclass: a what-if builds one per request
    and frozen dataclasses are several times slower to construct.
    """

    request_id: str
    num_prompt_tokens: int
    num_output_tokens: int
    #: 0 for waiting requests; at most one short of all tokens for running ones.
    num_computed_tokens: int
    #: Total output tokens the request will produce (prediction, corrected and capped).
    max_output_tokens: int
    num_cached_tokens: int = 0
    #: Prefix blocks found in the cache and held by others (prefix caching only).
    num_shared_blocks: int = 0
    #: Blocks a running request holds itself.
    num_owned_blocks: int = 0
    is_running: bool = False
    #: The new request whose timeline a what-if predicts.
    is_target: bool = False
    #: vLLM priority under the "priority" policy (see `SimRequest.priority`).
    priority: int = 0
    #: Chained keys of the prompt's full prefix units (`prefix_keys`); prefix caching only.
    prefix_keys: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def is_prefilling(self) -> bool:
        """Whether more than the last token is still to be computed."""
        return self.num_computed_tokens < self.num_tokens - 1


@dataclass(frozen=True, slots=True)
class PreparedInstance:
    """A snapshot in schedule order, ready for simulators to load (and to reuse)."""

    config: InstanceConfig
    #: Decodes first, then requests still prefilling (see `prepare`).
    running: tuple[SeqSpec, ...]
    #: FCFS order; under the "priority" policy by priority (ties in published order).
    waiting: tuple[SeqSpec, ...]
    #: Free blocks, never more than the running requests leave.
    num_free_blocks: int
    #: Ids of all its requests.
    request_ids: frozenset[str]
    #: What a simulator derives from the running requests once for every what-if on them
    #: (`FastSim`'s restored decodes), set on first use; not part of the instance's value, and
    #: not copied by `dataclasses.replace`.
    derived: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    def target(self, new_request: SimRequest) -> SeqSpec:
        """`new_request` normalised as the request a what-if follows."""
        if new_request.is_running or new_request.num_output_tokens:
            raise ValueError("the new request must be waiting with no output yet")
        if not new_request.predicted_output_tokens or new_request.predicted_output_tokens < 0:
            raise ValueError(f"{new_request.request_id}: the new request needs a "
                             f"predicted output length")
        if new_request.request_id in self.request_ids:
            raise ValueError(f"{new_request.request_id}: id already in the snapshot")
        return _normalise(new_request, self.config, OverrunPolicy())._replace(is_target=True)


def shared_prefix_blocks(num_prompt_tokens: int, num_cached_tokens: int,
                         config: InstanceConfig) -> int:
    """Whole prompt-prefix blocks found in the cache and held by other requests.

    vLLM recomputes at least the last prompt token, so the hit stops one short.
    """
    if not config.enable_prefix_caching:
        return 0
    return min(num_cached_tokens, num_prompt_tokens - 1) // config.block_size


def target_output_tokens(request: SimRequest, config: InstanceConfig,
                         overrun: OverrunPolicy = OverrunPolicy()) -> int:
    """Total output length to simulate for `request`: never below what it has produced."""
    generated = request.num_output_tokens
    predicted = request.predicted_output_tokens or 0
    if predicted > generated:
        total = predicted
    else:
        margin = math.ceil(overrun.margin_fraction * generated)
        total = generated + max(overrun.min_margin_tokens, margin, 1)
    # vLLM stops a request once prompt + output reaches max_model_len.
    total = min(total, config.max_model_len - request.num_prompt_tokens)
    return max(total, generated + 1)


def normalise(request: SimRequest, config: InstanceConfig,
              overrun: OverrunPolicy = OverrunPolicy()) -> SeqSpec:
    """`request` as the simulators take it (what `prepare` does to each request)."""
    return _normalise(request, config, overrun)


def _normalise(request: SimRequest, config: InstanceConfig, overrun: OverrunPolicy) -> SeqSpec:
    if request.num_prompt_tokens >= config.max_model_len:
        raise ValueError(f"{request.request_id}: prompt of {request.num_prompt_tokens} tokens "
                         f"does not fit max_model_len {config.max_model_len}")
    num_tokens = request.num_prompt_tokens + request.num_output_tokens
    if not config.enable_prefix_caching:  # NOTE: the common case, the rest's arithmetic
        computed = owned = 0             # without a shared prefix
        if request.is_running:
            computed = min(request.num_computed_tokens, num_tokens - 1)
            owned = -(-computed // config.block_size)
        return SeqSpec(request.request_id, request.num_prompt_tokens, request.num_output_tokens,
                       computed, target_output_tokens(request, config, overrun),
                       min(request.num_cached_tokens, request.num_prompt_tokens), 0, owned,
                       request.is_running, False, request.priority, ())
    keys = prefix_keys(request, config)
    shared = 0 if keys else shared_prefix_blocks(request.num_prompt_tokens,
                                                 request.num_cached_tokens, config)
    computed = owned = 0
    if request.is_running:
        # NOTE: a snapshot taken while a step is in flight can show every token as
        # computed; the last one is then still to be produced, as between steps.
        computed = min(request.num_computed_tokens, num_tokens - 1)
        if config.enable_prefix_caching and not keys:
            # A running request's cached prefix is computed: the hit's one-token-short
            # rule is behind it (a whole prompt of shared units stays shared).
            shared = min(request.num_cached_tokens, request.num_prompt_tokens, computed)
        else:
            shared *= config.block_size
        shared = min(shared, computed) // config.block_size
        owned = -(-computed // config.block_size) - shared
    return SeqSpec(request.request_id, request.num_prompt_tokens, request.num_output_tokens,
                   computed, target_output_tokens(request, config, overrun),
                   min(request.num_cached_tokens, request.num_prompt_tokens), shared, owned,
                   request.is_running, False, request.priority, keys)


def prefix_keys(request: SimRequest, config: InstanceConfig) -> tuple[int, ...]:
    """The chained keys of `request`'s full prefix units in its prompt: what the instance's
    prefix cache looks up and stores (none without prefix caching or hashes)."""
    if not config.enable_prefix_caching or not request.prefix_hashes:
        return ()
    num_units = request.num_prompt_tokens // config.prefix_unit_tokens
    return chain_prefix_hashes(request.prefix_hashes[:num_units])


def live_prefix_unit_tokens(block_size: int) -> int:
    """Tokens per prefix unit of a live engine with KV blocks of `block_size` tokens: the
    smallest multiple of the block size of at least `LIVE_PREFIX_UNIT_MIN_TOKENS`."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return block_size * -(-LIVE_PREFIX_UNIT_MIN_TOKENS // block_size)


def prefix_unit_hashes(token_ids: Sequence[int], unit_tokens: int) -> tuple[int, ...]:
    """Each full unit of `unit_tokens` prompt tokens' own hash, in order: a prompt's
    `SimRequest.prefix_hashes` from its token ids.

    The one function engines (to model and publish their prefix cache) and routers (to find a
    new request's match) hash prompts with; `prefix_keys` chains the result. Deterministic
    across processes (Python hashes tuples of ints without a per-process salt).
    """
    if unit_tokens <= 0:
        raise ValueError(f"unit_tokens must be positive, got {unit_tokens}")
    ids = [int(t) for t in token_ids]
    return tuple(hash(tuple(ids[start:start + unit_tokens]))
                 for start in range(0, len(ids) - unit_tokens + 1, unit_tokens))


def matched_prefix_tokens(request: SimRequest, cached: frozenset[int] | set[int],
                          config: InstanceConfig) -> int:
    """Prompt tokens of `request` an instance whose cache holds the keys `cached` would find:
    its leading full prefix units whose chained keys are all there."""
    count = 0
    for key in prefix_keys(request, config):
        if key not in cached:
            break
        count += 1
    return count * config.prefix_unit_tokens


def prepare(snapshot: InstanceSnapshot,
            overrun: OverrunPolicy = OverrunPolicy()) -> PreparedInstance:
    """Normalise a snapshot for simulation; reuse the result for every new request.

    Running requests are ordered decodes first, then those still prefilling, each
    group in published order. vLLM's running list always has this shape: a request
    gets prefill tokens only after every request ahead of it got all it asked for,
    so a prefill never finishes ahead of an earlier one.
    """
    config = snapshot.config
    specs = [_normalise(r, config, overrun) for r in snapshot.requests]
    running = sorted((s for s in specs if s.is_running), key=_is_prefilling)
    waiting = tuple(s for s in specs if not s.is_running)
    if config.is_priority:
        waiting = tuple(sorted(waiting, key=_priority))
    request_ids = frozenset(s.request_id for s in specs)
    if len(request_ids) != len(specs):
        raise ValueError("request ids in a snapshot must be unique")
    held = sum(s.num_owned_blocks for s in running)
    num_free = min(snapshot.num_free_blocks, config.num_usable_blocks - held)
    if num_free < 0:
        raise ValueError(f"running requests hold {held} blocks, more than the "
                         f"{config.num_usable_blocks} the instance can give")
    return PreparedInstance(config, tuple(running), waiting, num_free, request_ids)


def with_waiting(prepared: PreparedInstance, requests: Sequence[SimRequest],
                 overrun: OverrunPolicy = OverrunPolicy()) -> PreparedInstance:
    """`prepared` with waiting `requests` queued after its own: what `prepare` gives for its
    snapshot with them appended, without normalising the snapshot's requests again."""
    config = prepared.config
    specs = tuple(_normalise(r, config, overrun) for r in requests)
    if any(s.is_running for s in specs):
        raise ValueError("only waiting requests can be queued after a prepared instance")
    request_ids = prepared.request_ids | {s.request_id for s in specs}
    if len(request_ids) != len(prepared.request_ids) + len(specs):
        raise ValueError("request ids in a snapshot must be unique")
    waiting = prepared.waiting + specs
    if config.is_priority:  # NOTE: a stable sort: ties stay in published order
        waiting = tuple(sorted(waiting, key=_priority))
    result = PreparedInstance(config, prepared.running, waiting, prepared.num_free_blocks,
                              request_ids)
    result.derived.update(prepared.derived)  # the same running requests
    return result


def _priority(spec: SeqSpec) -> int:
    return spec.priority


def _is_prefilling(spec: SeqSpec) -> bool:
    return spec.is_prefilling
