"""The emulated engine: a digital twin of one GPU instance, for load, chaos and scale tests on CPUs.

`EmulatedEngine` implements `workers.serve.engine.Engine` without a model or a GPU. Its "GPU" is
`workers.sim.Scheduler` (vLLM v1 scheduling: token budget, max_num_seqs, KV blocks, chunked
prefill, recompute preemption) stepped in real time, or in scaled time: every step sleeps as long
as a ground-truth execution-time model (`workers.sim.ExecModel`) says that batch takes, times
multiplicative noise, times `time_scale` (1.0 is real time; 0.1 runs ten times faster).
Requests produce synthetic tokens (``"tok123 "``) and finish at their true output length, which
the emulator draws (see `workers.serve.output_lengths`), capped by max_tokens and max_model_len.
With `enable_prefix_caching` it models vLLM's automatic prefix caching in units of
`live_prefix_unit_tokens` prompt tokens: a request whose leading units are cached skips their
prefill, and its published state carries the units it holds (`workers.serve.prefixes`).

It has VllmEngine's threading shape: one engine thread owns the scheduler and loops "admit what
was submitted, apply aborts, step"; other threads exchange plain data with it through a
lock-protected inbox and futures; listener hooks run on the engine thread. It publishes the same
snapshot and step samples, with ``engine_kind="emulated"`` in every snapshot and "emulated" in
every log line, so nobody mistakes its numbers for a GPU's.

Requests are ordered as VllmEngine has vLLM order them (vLLM's priority policy, always): by class
first, every interactive request before any batch one, then by arrival ("fcfs") or by
predicted-shortest-first with aging ("priority"), each request's priority `engine_priority`. A
request short of KV blocks preempts the lowest-priority running request (a batch one while there
is one), as vLLM's scheduler does; a full running batch (max_num_seqs) preempts nothing in vLLM.
With `num_interactive_seats` the engine keeps that many seats free of batch work (a batch
request waits while max_num_seqs - num_interactive_seats requests run), so that an interactive
arrival is seated at once, and a burst beyond the reserve takes the seat of the running batch
request with the largest priority (preempted by recompute); with `batch_prefill_last` running
batch prefills go after every other running request and sit a step out while an interactive
request waits (vLLM runs `workers.serve.vllm_scheduler` for both rules). The snapshot says
"priority" whenever that order is not plain FCFS (a batch request in flight, or the "priority"
setting), so that what-ifs model the same order.

NOTE: sampling parameters and stop strings are accepted and ignored: the text is synthetic anyway.
What shapes the length is honoured: max_tokens, `ignore_eos` (it runs to max_tokens) and
`min_tokens` (no emulated EOS before it). Logprobs, when asked for, are synthetic too: each
token's is a deterministic value in [-5, 0] with made-up alternatives, so that clients reading
logprobs work against an emulated fleet; they mean nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import NamedTuple

from workers.serve.engine import (
    EngineListener,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    RequestRejected,
    StepSample,
    TokenLogprob,
)
from workers.serve.engine_thread import ThreadedEngine, TrackedRequest
from workers.serve.output_lengths import OutputLengths, ShareGptLengths
from workers.serve.prefixes import PrefixMemory
from workers.sim import (
    BatchStats,
    ExecModel,
    InstanceConfig,
    Scheduler,
    SeqState,
    SeqStatus,
    engine_priority,
    exec_model_of,
)
from workers.sim.engine_state import EngineState, RequestState
from workers.sim.snapshot import DEFAULT_PRIORITY_MS_PER_TOKEN, live_prefix_unit_tokens

__all__ = ["EmulatedEngine", "EmulatedEngineConfig", "approx_token_count"]

logger = logging.getLogger(__name__)

ENGINE_KIND = "emulated"
#: How far the engine may fall behind its emulated clock and still catch up by sleeping less
#: (sleep overshoot, a busy CPU). Beyond this, lost time is lost: the engine runs slower.
MAX_CATCH_UP_S = 0.05
#: Synthetic token ids are drawn below this (Llama-2's vocabulary size).
SYNTHETIC_VOCAB_SIZE = 32000

def approx_token_count(text: str) -> int:
    """About four characters per token (English BPE); at least one (the BOS token)."""
    return max(1, -(-len(text) // 4))


@dataclass(frozen=True, slots=True)
class EmulatedEngineConfig:
    """The emulated instance; the defaults are the Block paper's A30 serving Qwen2-7B."""

    # Ground-truth execution-time model: a bundled name (workers/sim/models) or a model.
    exec_model: str | ExecModel = "qwen2-7b-a30"
    # Name reported in snapshots. None: "emulated/<exec model name>".
    model: str | None = None
    num_blocks: int = 7289  # KV-cache blocks, as vLLM's num_gpu_blocks (one is the null block)
    block_size: int = 16  # tokens per KV block
    max_num_seqs: int = 48  # most requests in one batch
    max_num_batched_tokens: int = 512  # token budget per step (chunked prefill)
    max_model_len: int = 4096  # most tokens (prompt + output) per request
    # Wall seconds per emulated second: 1.0 real time, 0.1 ten times faster.
    time_scale: float = 1.0
    # Cold start: emulated seconds `start()` takes before the engine is ready, as a real one
    # loads its weights and profiles its memory (times time_scale, like every step).
    start_s: float = 0.0
    # Sigma of the multiplicative log-normal noise on every step's duration (mean 1); 0: none.
    noise: float = 0.05
    seed: int = 0  # seeds the step-time noise
    # True output length of a request before the max_tokens / max_model_len cap.
    output_lengths: OutputLengths = field(default_factory=ShareGptLengths)
    # Prompt tokens of a prompt text; give the served model's tokenizer to match the API.
    count_tokens: Callable[[str], int] = approx_token_count
    # vLLM's scheduling policy: "fcfs", or "priority": predicted-shortest-first with aging,
    # each request's priority its class, then its arrival and predicted length
    # (`engine_priority`).
    scheduling_policy: str = "fcfs"
    priority_ms_per_token: float = DEFAULT_PRIORITY_MS_PER_TOKEN
    # vLLM's automatic prefix caching, modelled in units of `prefix_unit_tokens` prompt tokens:
    # a request whose leading units are cached skips their prefill.
    enable_prefix_caching: bool = False
    # A prompt text's token ids (the served model's tokenizer): with prefix caching, text
    # prompts are hashed on these (and counted by them); None: only prompts given as token
    # ids find or fill the cache.
    tokenize: Callable[[str], Sequence[int]] | None = None
    # Seats of max_num_seqs kept for interactive requests: a batch request is not admitted
    # while max_num_seqs - this many requests run (`InstanceConfig.num_interactive_seats`),
    # so an interactive arrival finds a seat instead of waiting for a batch answer; 0: none.
    num_interactive_seats: int = 0
    # Running batch prefills after every other running request, out of a step while an
    # interactive request waits (`InstanceConfig.batch_prefill_last`).
    batch_prefill_last: bool = False

    @property
    def prefix_unit_tokens(self) -> int:
        """Tokens per prefix unit (`live_prefix_unit_tokens`); 0 without prefix caching."""
        return live_prefix_unit_tokens(self.block_size) if self.enable_prefix_caching else 0

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be positive, got {self.time_scale}")
        if self.noise < 0:
            raise ValueError(f"noise must not be negative, got {self.noise}")
        if self.start_s < 0:
            raise ValueError(f"start_s must not be negative, got {self.start_s}")
        self.instance_config()  # validates the scheduler settings

    def instance_config(self) -> InstanceConfig:
        """The scheduler settings, as the instance simulator takes them."""
        return InstanceConfig(
            num_total_blocks=self.num_blocks,
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            scheduling_policy=self.scheduling_policy,
            priority_ms_per_token=self.priority_ms_per_token,
            enable_prefix_caching=self.enable_prefix_caching,
            prefix_block_size=self.prefix_unit_tokens,
            num_interactive_seats=self.num_interactive_seats,
            batch_prefill_last=self.batch_prefill_last,
        )


class _Prepared(NamedTuple):
    """A prompt's token count and, with prefix caching, its units' chained keys."""

    num_prompt_tokens: int
    prefix_keys: tuple[int, ...] = ()


@dataclass(slots=True, eq=False, kw_only=True)
class _Tracked(TrackedRequest):
    """A submitted request, with the output length at which it finishes."""

    num_target_tokens: int  # the output length at which it finishes
    finish_reason: FinishReason  # how it will finish: "length" if a cap cut it short
    seq: SeqState | None = None  # once handed to the scheduler
    priority: int = 0  # vLLM priority (used under the "priority" policy)
    prefix_keys: tuple[int, ...] = ()  # its prompt units' chained keys (prefix caching)
    num_cached_tokens: int | None = None  # prompt tokens the prefix cache served, once known


class EmulatedEngine(ThreadedEngine[_Tracked]):
    """`Engine` whose GPU is the vLLM scheduling model run in (scaled) real time."""

    kind = ENGINE_KIND
    display_name = "emulated engine"
    thread_name = "emulated-engine"

    def __init__(
        self, config: EmulatedEngineConfig | None = None, listener: EngineListener | None = None
    ) -> None:
        super().__init__(listener)
        self.config = config if config is not None else EmulatedEngineConfig()
        exec_model = self.config.exec_model
        self.exec_model = exec_model_of(exec_model) if isinstance(exec_model, str) else exec_model
        self.model = self.config.model or f"emulated/{self.exec_model.name}"
        self._instance_config = self.config.instance_config()
        #: Each request's priority: its class, then arrival ms + this x its predicted length.
        self._ms_per_token = (self.config.priority_ms_per_token
                              if self.config.scheduling_policy == "priority" else 0.0)
        # --- guarded by _cond ---
        # NOTE: vLLM's priority policy whatever the setting, as VllmEngine runs vLLM: under
        # "fcfs" each priority is the class, then the arrival (`_ms_per_token` 0).
        self._scheduler = Scheduler(dataclasses.replace(self._instance_config,
                                                        scheduling_policy="priority"))
        self._prefixes: PrefixMemory | None = None
        if self.config.enable_prefix_caching:
            unit_tokens = self.config.prefix_unit_tokens
            self._prefixes = PrefixMemory(unit_tokens, self._instance_config.num_usable_blocks
                                          * self.config.block_size // unit_tokens)
        # --- engine thread only ---
        self._rng = random.Random(self.config.seed)  # step-time noise
        self._clock_s: float | None = None  # monotonic end of the last step; None when idle

    def start(self) -> None:
        """Start the engine thread, after the configured cold start (nothing to load)."""
        config = self.config
        if config.start_s > 0:
            logger.info("emulated engine: cold start of %g emulated s (%.2f s wall)",
                        config.start_s, config.start_s * config.time_scale)
            time.sleep(config.start_s * config.time_scale)
        super().start()
        logger.info(
            "emulated engine ready (no GPU: simulated vLLM scheduler): exec model=%s blocks=%d "
            "block_size=%d max_num_seqs=%d budget=%d max_model_len=%d time_scale=%g noise=%g",
            self.exec_model.name, config.num_blocks, config.block_size, config.max_num_seqs,
            config.max_num_batched_tokens, config.max_model_len, config.time_scale, config.noise,
        )

    def snapshot(self) -> EngineState:
        """Exact scheduler state: running requests in running order, then waiting ones in
        scheduling order, then those submitted since the last step."""
        with self._cond:
            scheduler = self._scheduler
            seqs = [*scheduler.running, *scheduler.waiting]
            requests = [self._state_of(self._inflight[s.request_id]) for s in seqs]
            # Submitted, not in the scheduler yet (in submission order).
            requests += [self._state_of(t) for t in self._inflight.values() if t.seq is None]
            num_running = len(scheduler.running)
            num_free = scheduler.block_pool.num_free
            policy = self._published_policy()
            cached = self._published_prefixes()
        config = self.config
        return EngineState(
            engine_kind=ENGINE_KIND,
            model=self.model,
            num_running=num_running,
            num_waiting=len(requests) - num_running,
            # NOTE: like VllmEngine, the blocks requests can hold (vLLM keeps a null block).
            num_total_blocks=self._instance_config.num_usable_blocks,
            num_free_blocks=num_free,
            block_size=config.block_size,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len,
            requests=tuple(requests),
            taken_at=time.time(),
            scheduling_policy=policy,
            priority_ms_per_token=self._ms_per_token,
            prefix_unit_tokens=config.prefix_unit_tokens,
            cached_prefixes=cached,
            num_interactive_seats=config.num_interactive_seats,
            batch_prefill_last=config.batch_prefill_last,
        )

    def _published_prefixes(self) -> tuple[int, ...]:
        """The prefix units to publish (`PrefixMemory.published`): the in-flight requests',
        then those of finished ones the emulated cache still holds. Under the lock."""
        if self._prefixes is None:
            return ()
        return self._prefixes.published((t.prefix_keys for t in self._inflight.values()),
                                        self._scheduler.block_pool.is_cached)

    def _published_policy(self) -> str:
        """The policy what-ifs must model on the snapshot. Under the lock.

        "fcfs" orders by class, then arrival: plain FCFS while every request in flight is
        interactive, vLLM's priority policy (priorities class, then arrival ms) once a batch
        request is in: a what-if then puts a new interactive request ahead of waiting batch
        work, as the engine will.
        """
        if self.config.scheduling_policy == "priority" or any(
                t.request.priority for t in self._inflight.values()):
            return "priority"
        return "fcfs"

    @staticmethod
    def _state_of(tracked: _Tracked) -> RequestState:
        seq = tracked.seq
        return RequestState(
            request_id=tracked.request.request_id,
            num_prompt_tokens=tracked.num_prompt_tokens,
            num_computed_tokens=seq.num_computed_tokens if seq is not None else 0,
            num_output_tokens=tracked.num_output_tokens,
            predicted_output_tokens=tracked.request.predicted_output_tokens,
            is_running=seq is not None and seq.status == SeqStatus.RUNNING,
            priority=tracked.priority,
            num_cached_tokens=tracked.num_cached_tokens or 0,
        )

    # ---------------------------------------------------------------- new requests

    def _prepare(self, request: GenerationRequest) -> _Prepared:
        """The prompt's token count and prefix keys (tokenizing is slow: done outside the
        lock)."""
        token_ids = request.prompt_token_ids
        if self._prefixes is None or (token_ids is None and self.config.tokenize is None):
            if token_ids is not None:
                return _Prepared(len(token_ids))
            return _Prepared(self.config.count_tokens(request.prompt))
        if token_ids is None:
            assert self.config.tokenize is not None
            token_ids = self.config.tokenize(request.prompt)
        return _Prepared(len(token_ids), self._prefixes.keys_of(token_ids))

    def _track(
        self, request: GenerationRequest, future: Future[GenerationResult], prepared: object
    ) -> _Tracked:
        """Bookkeeping for a new request, with the output length at which it will finish."""
        assert isinstance(prepared, _Prepared)
        num_prompt_tokens = prepared.num_prompt_tokens
        max_len = self.config.max_model_len
        if num_prompt_tokens >= max_len:
            raise RequestRejected(
                f"{request.request_id}: prompt of {num_prompt_tokens} tokens does not fit "
                f"max_model_len {max_len} (emulated engine)")
        num_room = max_len - num_prompt_tokens  # vLLM stops at max_model_len
        sampling = request.sampling
        num_drawn = max(1, sampling.min_tokens, int(self.config.output_lengths(request)))
        num_cap = min(request.max_tokens, num_room)
        if sampling.ignore_eos:  # no emulated EOS: it runs to the cap
            num_drawn = num_cap
        # An emulated EOS when the drawn length comes first; otherwise a cap cut it ("length").
        reason: FinishReason = "stop" if num_drawn < num_cap else "length"
        admitted_at = time.time()
        tracked = _Tracked(request, future, admitted_at, num_prompt_tokens,
                           num_target_tokens=min(num_drawn, num_cap), finish_reason=reason,
                           priority=engine_priority(request.priority, admitted_at,
                                                    request.predicted_output_tokens,
                                                    self._ms_per_token))
        tracked.prefix_keys = prepared.prefix_keys
        if sampling.prompt_logprobs is not None:
            tracked.prompt_logprobs = [
                _synthetic_logprob(request.request_id, -i, sampling.prompt_logprobs)
                for i in range(num_prompt_tokens)]
            tracked.prompt_logprobs[0].update(logprob=None, top=[])  # nothing precedes it
        return tracked

    # ---------------------------------------------------------------- engine thread

    def _has_work(self) -> bool:
        return self._scheduler.has_unfinished_requests

    def _admit(self, admitted: list[_Tracked]) -> None:
        """Hand new requests to the scheduler."""
        with self._cond:
            for tracked in admitted:
                if not tracked.future.set_running_or_notify_cancel():  # cancelled meanwhile
                    del self._inflight[tracked.request_id]
                    continue
                tracked.seq = SeqState(tracked.request_id, tracked.num_prompt_tokens,
                                       tracked.num_target_tokens, priority=tracked.priority,
                                       arrival_s=tracked.admitted_at)
                tracked.seq.prefix_keys = tracked.prefix_keys
                self._scheduler.add_request(tracked.seq)

    def _abort(self, request_ids: list[str]) -> None:
        """Take aborted requests out of the scheduler, resolve them with "abort"."""
        with self._cond:
            aborted = [self._inflight.pop(rid) for rid in request_ids if rid in self._inflight]
            for tracked in aborted:
                if tracked.seq is not None:
                    self._drop_from_scheduler(tracked.seq)
            self._note_if_idle()
        now = time.time()
        for tracked in aborted:
            self._resolve(tracked, "abort", now)

    def _note_if_idle(self) -> None:
        """Idle: the next step starts when work comes, not back to back. Under the lock."""
        if not self._scheduler.has_unfinished_requests:
            self._clock_s = None

    def _drop_from_scheduler(self, seq: SeqState) -> None:
        """Take an aborted request out of the scheduler and free its blocks. Under the lock.

        NOTE: `workers.sim.Scheduler` has no abort (vLLM's ``finish_requests``): the simulator
        never needs one. This does the same on its public state, between two steps.
        """
        scheduler = self._scheduler
        if seq.status == SeqStatus.RUNNING:
            scheduler.running.remove(seq)
        else:
            scheduler.waiting.remove(seq)
        del scheduler.requests[seq.request_id]
        scheduler.block_pool.free(seq.num_owned_blocks, reusable=False)
        seq.num_owned_blocks = 0
        if seq.status == SeqStatus.RUNNING and seq.num_prefix_held:
            # Its prefix units stay cached for others (a preempted one let go of them).
            scheduler.block_pool.release_prefix(seq.prefix_keys[:seq.num_prefix_held])
            seq.num_prefix_held = seq.num_shared_blocks = 0
        seq.status = SeqStatus.FINISHED

    def _step(self) -> None:
        """One emulated forward pass: schedule, "run" it (sleep its duration), take its output."""
        with self._cond:
            output = self._scheduler.schedule()
            if self._prefixes is not None:
                self._note_cache_hits(output.num_scheduled_tokens)
        assert output.num_scheduled_tokens or output.preempted_ids, (
            "requests wait but none can be scheduled")
        if not output.num_scheduled_tokens:
            # NOTE: priority policy: the first running request preempted itself (the
            # lowest priority); vLLM runs nothing this step and it takes no time.
            with self._cond:
                self._scheduler.update_from_output(output)
            return
        duration_s = self._step_duration_s(output.stats)
        self._sleep_until(self._advance_clock(duration_s))
        now = time.time()
        first_tokens: list[str] = []
        deltas: list[tuple[str, str]] = []
        finished: list[_Tracked] = []
        with self._cond:
            result = self._scheduler.update_from_output(output)
            for request_id in result.sampled_ids:
                tracked = self._inflight[request_id]
                tracked.num_output_tokens += 1  # the scheduler sampled one more token
                if tracked.first_token_at is None:
                    tracked.first_token_at = now
                    first_tokens.append(request_id)
                text = _synthetic_token(request_id, tracked.num_output_tokens)
                tracked.text_parts.append(text)
                if tracked.request.sampling.logprobs is not None:
                    tracked.output_logprobs.append(_synthetic_logprob(
                        request_id, tracked.num_output_tokens, tracked.request.sampling.logprobs))
                deltas.append((request_id, text))
            for request_id in result.finished_ids:
                tracked = self._inflight.pop(request_id)
                self._remember(request_id, tracked.future)
                finished.append(tracked)
                if self._prefixes is not None:
                    self._prefixes.finished(tracked.prefix_keys)
            sample = self._sample(output.stats, len(output.num_scheduled_tokens), duration_s, now)
            self._note_if_idle()
        for request_id in first_tokens:
            self._notify("on_first_token", request_id, now)
        for request_id, text in deltas:
            self._notify("on_tokens", request_id, text)
        for tracked in finished:
            self._resolve(tracked, tracked.finish_reason, now)
        self._notify("on_step", sample)

    def _note_cache_hits(self, num_scheduled_tokens: dict[str, int]) -> None:
        """Note what the prefix cache served each request scheduled for the first time (its
        tokens computed before this step's chunk). Under the lock."""
        for request_id, num_new in num_scheduled_tokens.items():
            tracked = self._inflight[request_id]
            if tracked.num_cached_tokens is None and tracked.seq is not None:
                tracked.num_cached_tokens = tracked.seq.num_computed_tokens - num_new

    def _step_duration_s(self, stats: BatchStats) -> float:
        """Wall seconds of a step: ground truth x log-normal noise (mean 1) x time scale."""
        sigma = self.config.noise
        factor = self._rng.lognormvariate(-sigma * sigma / 2.0, sigma) if sigma > 0 else 1.0
        return self.exec_model.step_ms(stats) / 1000.0 * factor * self.config.time_scale

    def _advance_clock(self, duration_s: float) -> float:
        """The monotonic time at which the step ends.

        Back-to-back steps follow each other on the emulated clock, not on the wall clock,
        so sleep overshoot and bookkeeping between steps do not add up over a long run.
        """
        now = time.monotonic()
        start = now if self._clock_s is None else max(self._clock_s, now - MAX_CATCH_UP_S)
        self._clock_s = start + duration_s
        return self._clock_s

    def _sleep_until(self, deadline: float) -> None:
        with self._cond:
            while not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._cond.wait(remaining)

    def _sample(
        self, stats: BatchStats, num_seqs: int, duration_s: float, now: float
    ) -> StepSample:
        """The step as VllmEngine reports one. Called under the lock.

        NOTE: duration_ms is the step's emulated duration in wall time (time_scale applied):
        the clock every other timing of this engine (TTFT, latency) is measured on.
        """
        scheduler = self._scheduler
        usable = self._instance_config.num_usable_blocks
        return StepSample(
            at=now,
            duration_ms=duration_s * 1000.0,
            num_seqs=num_seqs,
            num_prefill_tokens=stats.num_prefill_tokens,
            num_decode_tokens=stats.num_decode_seqs,
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting) + len(self._inbox),
            kv_cache_usage=1.0 - scheduler.block_pool.num_free / usable,
            decode_context_tokens=stats.decode_context_tokens,
            prefill_chunk_x_context=stats.prefill_chunk_x_context,
            prefill_chunk_sq=stats.prefill_chunk_sq,
        )


def _synthetic_id(request_id: str, index: int) -> int:
    return (zlib.crc32(request_id.encode()) + 7919 * index) % SYNTHETIC_VOCAB_SIZE


def _synthetic_token(request_id: str, index: int) -> str:
    """The text of output token `index` (1-based) of a request: ``"tok<id> "``, deterministic."""
    return f"tok{_synthetic_id(request_id, index)} "


def _synthetic_logprob(request_id: str, index: int, num_top: int) -> TokenLogprob:
    """A made-up logprob of token `index` (output: 1-based; prompt: 0 or below) and `num_top`
    alternatives, in the stored shape: the token is the most likely, alternatives follow."""
    token_id = _synthetic_id(request_id, index)
    logprob = -(token_id % 500) / 100.0
    top = [{"id": (token_id + rank) % SYNTHETIC_VOCAB_SIZE,
            "token": f"tok{(token_id + rank) % SYNTHETIC_VOCAB_SIZE} ",
            "logprob": logprob - rank, "rank": rank + 1} for rank in range(max(1, num_top))]
    return {"id": token_id, "token": f"tok{token_id} ", "logprob": logprob, "top": top}
