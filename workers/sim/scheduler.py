"""A step-by-step model of vLLM v1's scheduler: which tokens run in each engine step.

One `Scheduler.schedule()` call is one forward pass, as in
``vllm/v1/core/sched/scheduler.py``: running requests first (decodes and partial
prefills, in running order) under the token budget, preempting the last running
request by recompute when KV blocks run out; then, if nothing was preempted,
waiting requests first come first served while the budget, ``max_num_seqs`` and
the blocks (with the watermark) allow. Under the "priority" policy
(``InstanceConfig.scheduling_policy``) waiting requests are served in (priority,
arrival) order and the running request with the largest (priority, arrival) is the
one preempted, wherever it stands in the running list (a victim already scheduled
this step gives its tokens back), as vLLM's ``PriorityRequestQueue`` and
``Scheduler.schedule`` do; ties on both go in insertion order (vLLM: request id).
Under "priority" a waiting batch-class request is admitted only while fewer than
``max_num_seqs - num_interactive_seats`` requests run (`InstanceConfig.num_interactive_seats`):
the seat reserve the engines keep for interactive arrivals (they hold the batch request
back); and when an interactive request heads the queue with every seat taken (a burst beyond
the reserve), the running batch request with the largest priority gives its seat up at the
start of the step, preempted by recompute, one a step (vLLM itself preempts for KV blocks
only; the engines add this seat rule). With
``InstanceConfig.batch_prefill_last`` each step first moves running batch requests that are
prefilling to the end of the running list (stable), so that interactive prefills are scheduled
before them, and while an interactive request waits they sit the step out (out of the running
list while it is scheduled, seats still counted), never two steps in a row: the engines treat
vLLM's running list the same way.
``update_from_output()`` then appends one sampled token to every request whose
tokens are all computed and retires the finished ones. Time is not modelled here;
an execution-time model prices each step's `BatchStats`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import IntEnum

from .batch_rules import (
    PRIORITY_CLASS_SPAN_MS,
    has_seat,
    is_late_batch_prefill,
    put_batch_prefills_last,
    seat_to_yield,
)
from .block_pool import BlockPool
from .exec_model import BatchStats
from .snapshot import InstanceConfig, SeqSpec, shared_prefix_blocks

__all__ = ["Scheduler", "SchedulerOutput", "SeqState", "SeqStatus", "StepResult"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class SeqStatus(IntEnum):
    WAITING = 0
    PREEMPTED = 1
    RUNNING = 2
    FINISHED = 3


@dataclass(slots=True, eq=False)
class SeqState:
    """One request inside the scheduler."""

    request_id: str
    num_prompt_tokens: int
    #: Output length at which the request finishes.
    max_output_tokens: int
    num_output_tokens: int = 0
    num_computed_tokens: int = 0
    #: Prompt-prefix tokens cached in blocks other requests hold (prefix caching).
    num_cached_tokens: int = 0
    status: SeqStatus = SeqStatus.WAITING
    #: Prefix blocks shared with other requests: held at no cost, never freed by us.
    num_shared_blocks: int = 0
    #: Blocks this request holds and frees when it finishes or is preempted.
    num_owned_blocks: int = 0
    num_preemptions: int = 0
    #: vLLM priority and arrival time: the "priority" policy's order (smaller first).
    priority: int = 0
    arrival_s: float = 0.0
    #: Chained keys of the prompt's full prefix units (`snapshot.prefix_keys`): with them the
    #: shared blocks are the units found in (or added to) the instance's prefix cache.
    prefix_keys: tuple[int, ...] = ()
    #: Leading prefix units the request holds (while running; kept when it is preempted).
    num_prefix_held: int = 0
    #: Whether its computed units still join the cache (not once one was there already).
    prefix_open: bool = True

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @classmethod
    def from_spec(cls, spec: SeqSpec) -> SeqState:
        return cls(spec.request_id, spec.num_prompt_tokens, spec.max_output_tokens,
                   spec.num_output_tokens, spec.num_computed_tokens, spec.num_cached_tokens,
                   num_shared_blocks=spec.num_shared_blocks,
                   num_owned_blocks=spec.num_owned_blocks, priority=spec.priority,
                   prefix_keys=spec.prefix_keys)

    @property
    def priority_key(self) -> tuple[int, float]:
        return self.priority, self.arrival_s


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """What one step computes."""

    #: Tokens scheduled per request, in schedule order.
    num_scheduled_tokens: dict[str, int]
    #: The batch composition, for the execution-time model.
    stats: BatchStats
    #: Requests preempted (back to waiting, KV dropped) while scheduling this step.
    preempted_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StepResult:
    """A scheduled step and its outcome."""

    output: SchedulerOutput
    #: Requests that produced one output token in this step.
    sampled_ids: tuple[str, ...]
    #: Requests that produced their last token in this step.
    finished_ids: tuple[str, ...]


def _is_late(seq: SeqState) -> bool:
    return is_late_batch_prefill(seq.priority, seq.num_tokens, seq.num_computed_tokens)


class Scheduler:
    """vLLM v1 scheduling (FCFS or priority, chunked prefill, recompute preemption) of one
    instance."""

    def __init__(self, config: InstanceConfig, num_free_blocks: int | None = None) -> None:
        self.config = config
        free = config.num_usable_blocks if num_free_blocks is None else num_free_blocks
        self.block_pool = BlockPool(free, track_owners=config.enable_prefix_caching,
                                    unit_blocks=config.prefix_unit_blocks)
        #: Unfinished requests by id.
        self.requests: dict[str, SeqState] = {}
        self.waiting: deque[SeqState] = deque()
        self.running: list[SeqState] = []
        self.num_preemptions = 0
        self.is_priority = config.is_priority
        #: Seats kept for interactive requests (`InstanceConfig.num_interactive_seats`); an
        #: engine that sizes its reserve as it goes sets this between steps.
        self.num_interactive_seats = config.num_interactive_seats
        self.batch_prefill_last = config.is_priority and config.batch_prefill_last
        #: Whether batch prefills sat the last step out (they run in the next one).
        self.sat_out_last_step = False

    # -- requests in ------------------------------------------------------------------
    def add_request(self, seq: SeqState) -> None:
        """Queue a request (new, or waiting in a snapshot) at the back of waiting."""
        self._register(seq)
        seq.status = SeqStatus.WAITING if not seq.num_output_tokens else SeqStatus.PREEMPTED
        seq.num_computed_tokens = 0
        seq.num_shared_blocks = 0 if seq.prefix_keys else shared_prefix_blocks(
            seq.num_prompt_tokens, seq.num_cached_tokens, self.config)
        if self.is_priority:
            self._insert_by_priority(seq)
        else:
            self.waiting.append(seq)

    def _insert_by_priority(self, seq: SeqState) -> None:
        """Queue `seq` behind every waiting request whose (priority, arrival) is not larger."""
        key = seq.priority_key
        waiting = self.waiting
        index = len(waiting)
        while index and waiting[index - 1].priority_key > key:
            index -= 1
        waiting.insert(index, seq)

    def restore_running(self, seq: SeqState) -> None:
        """Append a request that is already running, as a snapshot shows it.

        Its shared and owned blocks are as given (see `SeqSpec`); the pool's free
        count must already exclude them.
        """
        self._register(seq)
        assert seq.num_computed_tokens < seq.num_tokens, seq
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)
        if seq.prefix_keys:
            self._cache_units(seq, seq.num_computed_tokens)

    def _register(self, seq: SeqState) -> None:
        if seq.request_id in self.requests:
            raise ValueError(f"duplicate request id {seq.request_id!r}")
        if seq.num_output_tokens >= seq.max_output_tokens:
            raise ValueError(f"{seq.request_id}: already has all its output tokens")
        self.requests[seq.request_id] = seq

    @property
    def has_unfinished_requests(self) -> bool:
        return bool(self.running or self.waiting)

    # -- one step -----------------------------------------------------------------------
    def step(self) -> StepResult:
        """One engine step: schedule it, then take its output."""
        return self.update_from_output(self.schedule())

    def schedule(self) -> SchedulerOutput:
        """Choose this step's tokens; advances ``num_computed_tokens`` like vLLM does."""
        aside: list[SeqState] = []
        if not self.running:
            self._reclaim_idle_blocks()
        elif self.batch_prefill_last:
            aside = self._put_batch_prefills_last()
        yielded = self._yield_a_seat(len(aside))
        budget = self.config.max_num_batched_tokens
        scheduled: dict[str, int] = {}
        preempted: list[SeqState] = []
        budget = self._schedule_running(budget, scheduled, preempted)
        if not preempted:
            self._schedule_waiting(budget, scheduled, len(aside))
        self.running.extend(aside)
        preempted[:0] = yielded
        chunks = []
        requests = self.requests
        for request_id, num_new in scheduled.items():
            seq = requests[request_id]
            computed = seq.num_computed_tokens
            chunks.append((num_new, computed, seq.num_prompt_tokens + seq.num_output_tokens))
            seq.num_computed_tokens = computed + num_new
        stats = BatchStats.of_chunks(chunks)
        self._check_invariants(scheduled)
        return SchedulerOutput(scheduled, stats, tuple(s.request_id for s in preempted))

    def update_from_output(self, output: SchedulerOutput) -> StepResult:
        """Sample one token for each fully computed request; retire finished ones."""
        sampled: list[str] = []
        finished: list[str] = []
        requests = self.requests
        for request_id in output.num_scheduled_tokens:
            seq = requests[request_id]
            if seq.num_computed_tokens < seq.num_prompt_tokens + seq.num_output_tokens:
                continue  # a partial prefill samples nothing
            seq.num_output_tokens += 1
            sampled.append(request_id)
            if seq.num_output_tokens >= seq.max_output_tokens:
                self._finish(seq)
                finished.append(request_id)
        return StepResult(output, tuple(sampled), tuple(finished))

    # -- scheduling helpers -------------------------------------------------------------
    def _interactive_waits(self) -> bool:
        return bool(self.waiting) and self.waiting[0].priority < PRIORITY_CLASS_SPAN_MS

    def _put_batch_prefills_last(self) -> list[SeqState]:
        """Batch prefills last (`batch_rules.put_batch_prefills_last`): those sitting this
        step out."""
        aside, self.sat_out_last_step = put_batch_prefills_last(
            self.running, _is_late, self._interactive_waits(), self.sat_out_last_step)
        return aside

    def _yield_a_seat(self, num_aside: int) -> list[SeqState]:
        """With seats kept for interactive requests, the running batch request that gives its
        seat up (`batch_rules.seat_to_yield`), preempted by recompute before anything is
        scheduled; one a step. The preempted one, if any."""
        if not (self.num_interactive_seats and self.is_priority):
            return []
        victim = seat_to_yield(self.running, num_aside, self.config.max_num_seqs,
                               self._interactive_waits(), SeqState.priority_key.fget)
        if victim is None:
            return []
        self.running.remove(victim)
        self._preempt(victim)
        return [victim]

    def _schedule_running(self, budget: int, scheduled: dict[str, int],
                          preempted: list[SeqState]) -> int:
        # NOTE: the hot path of the cluster benchmark's ground truth (a step per request
        # in the batch): plain arithmetic on locals, no helper calls.
        block_size = self.config.block_size
        pool = self.block_pool
        running = self.running
        index = 0
        while index < len(running) and budget > 0:
            seq = running[index]
            computed = seq.num_computed_tokens
            num_new = seq.num_prompt_tokens + seq.num_output_tokens - computed
            if num_new > budget:
                num_new = budget
            assert num_new > 0, seq
            num_needed = (-(-(computed + num_new) // block_size)
                          - seq.num_shared_blocks - seq.num_owned_blocks)
            while num_needed > pool.num_free:
                if self.is_priority:
                    victim = max(running, key=SeqState.priority_key.fget)
                    victim_index = running.index(victim)
                    del running[victim_index]
                    if victim_index < index:
                        index -= 1
                    # A victim already scheduled this step gives its tokens back.
                    budget += scheduled.pop(victim.request_id, 0)
                else:
                    # NOTE: FCFS preempts the last running request; it is never one
                    # already scheduled this step, as those all come before `seq`.
                    victim = running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    return budget
            if num_needed:
                pool.allocate(num_needed)
                seq.num_owned_blocks += num_needed
            scheduled[seq.request_id] = num_new
            if seq.prefix_open and seq.prefix_keys:
                # vLLM caches a chunk's full blocks as it allocates them: requests
                # scheduled after this one in the same step can hit them.
                self._cache_units(seq, computed + num_new)
            budget -= num_new
            index += 1
        return budget

    def _schedule_waiting(self, budget: int, scheduled: dict[str, int],
                          num_aside: int = 0) -> None:
        """Admit waiting requests; `num_aside` running requests sit this step out."""
        max_num_seqs = self.config.max_num_seqs
        seats = self.num_interactive_seats if self.is_priority else 0
        while budget > 0 and self.waiting:
            seq = self.waiting[0]
            # NOTE: a batch request held for the interactive seats holds every one behind it.
            if not has_seat(len(self.running) + num_aside, max_num_seqs, seats, seq.priority):
                break
            num_new = self._try_admit(seq, budget)
            if not num_new:
                break
            self.waiting.popleft()
            self.running.append(seq)
            scheduled[seq.request_id] = num_new
            if seq.prefix_keys:
                self._cache_units(seq, seq.num_computed_tokens + num_new)
            budget -= num_new

    def _try_admit(self, seq: SeqState, budget: int) -> int:
        """Allocate the first chunk of a waiting request; 0 when it does not fit.

        With prefix keys, the leading units the cache holds are a hit: those in use cost
        nothing, those in the free queue are taken out of it (vLLM counts them as blocks
        to allocate)."""
        config = self.config
        block_size = config.block_size
        pool = self.block_pool
        shared = seq.num_shared_blocks
        own_cached = hit_units = queue_hit = 0
        if config.enable_prefix_caching:
            max_hit_blocks = (seq.num_tokens - 1) // block_size
            if seq.prefix_keys:
                hit_units, queue_hit = pool.match_prefix(
                    seq.prefix_keys, max_hit_blocks // pool.unit_blocks)
                shared = hit_units * pool.unit_blocks
            if hit_units >= seq.num_prefix_held:  # its own blocks follow its units
                own_cached = min(pool.num_cached(seq.request_id), max_hit_blocks - shared)
        num_computed = (shared + own_cached) * block_size
        num_new = min(seq.num_tokens - num_computed, budget)
        watermark = config.num_watermark_blocks if self.running else 0
        if config.reserve_full_input and (_cdiv(seq.num_tokens, block_size) - shared
                                          + queue_hit + watermark > pool.num_free):
            return 0
        num_needed = _cdiv(num_computed + num_new, block_size) - shared
        if num_needed + queue_hit + watermark > pool.num_free:
            return 0
        if hit_units:
            pool.acquire_prefix(seq.prefix_keys[:hit_units])
        if config.enable_prefix_caching:
            pool.reclaim(seq.request_id, own_cached)
        pool.allocate(num_needed - own_cached)
        if seq.prefix_keys:
            seq.num_shared_blocks = shared
            seq.num_prefix_held = hit_units
            seq.prefix_open = True
        seq.num_owned_blocks = num_needed
        seq.num_computed_tokens = num_computed
        seq.status = SeqStatus.RUNNING
        return num_new

    def _cache_units(self, seq: SeqState, num_computed: int) -> None:
        self.block_pool.cache_computed_units(seq, num_computed, self.config.prefix_unit_tokens)

    def _release_prefix(self, seq: SeqState) -> None:
        """Let go of `seq`'s prefix units (after its own blocks, as vLLM frees tail first)."""
        if seq.prefix_keys:
            self.block_pool.release_prefix(seq.prefix_keys[:seq.num_prefix_held])
            seq.num_shared_blocks = 0

    def _preempt(self, seq: SeqState) -> None:
        """Drop `seq`'s KV and put it back in waiting (recompute on resume): at the front
        (FCFS), or in its priority's place."""
        owner = seq.request_id if self.config.enable_prefix_caching else None
        self.block_pool.release(seq.num_owned_blocks, self._num_full_blocks(seq), owner)
        self._release_prefix(seq)
        seq.num_owned_blocks = 0
        seq.num_computed_tokens = 0
        seq.status = SeqStatus.PREEMPTED
        seq.num_preemptions += 1
        self.num_preemptions += 1
        if self.is_priority:
            self._insert_by_priority(seq)
        else:
            self.waiting.appendleft(seq)

    def _finish(self, seq: SeqState) -> None:
        self.running.remove(seq)
        del self.requests[seq.request_id]
        self.block_pool.release(seq.num_owned_blocks, self._num_full_blocks(seq))
        self._release_prefix(seq)
        seq.num_owned_blocks = 0
        seq.status = SeqStatus.FINISHED

    def _num_full_blocks(self, seq: SeqState) -> int:
        """Owned blocks full of computed tokens: vLLM caches these, not a partial last one."""
        full = seq.num_computed_tokens // self.config.block_size - seq.num_shared_blocks
        return min(max(full, 0), seq.num_owned_blocks)

    def _reclaim_idle_blocks(self) -> None:
        # NOTE: with nothing running every block is free. A snapshot's counts can
        # disagree (shared prefix blocks have no owner here); trust the idle state.
        missing = self.config.num_usable_blocks - self.block_pool.num_free
        if missing > 0:
            self.block_pool.free(missing, reusable=False)

    def _check_invariants(self, scheduled: dict[str, int]) -> None:
        config = self.config
        assert sum(scheduled.values()) <= config.max_num_batched_tokens, scheduled
        assert len(self.running) <= config.max_num_seqs, len(self.running)
        held = sum(s.num_owned_blocks for s in self.running) + self.block_pool.num_in_use_blocks
        assert self.block_pool.num_free >= 0, self.block_pool.num_free
        assert held + self.block_pool.num_free <= config.num_usable_blocks, (
            held, self.block_pool.num_free)
