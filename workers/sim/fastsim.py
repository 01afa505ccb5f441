"""Event-driven replay of the vLLM scheduler: jumps over stable decode phases.

The step-by-step `Scheduler` costs O(running requests) per engine step and a
what-if needs hundreds of steps. This engine gives the same schedule (tests
compare the two on random snapshots) at the cost of O(1) per stable decode step
and O(changed requests) per other step:

* Decodes are kept implicitly. A decoding sequence gains one token per step, so
  it is stored as an anchor (step, length) and its state at any later step is
  derived. Per step the decode batch needs ``count[step % block_size]`` new
  blocks (a sequence needs one when its length crosses a block boundary), its
  context is ``sum(anchor lengths - anchor steps) + num_decodes * step``, and
  finish steps sit in a heap.
* While nothing but decodes runs and no waiting request can be admitted, every
  step has the same shape until the next event: a request finishes, or the
  blocks run out (preemption). The engine finds that step directly and sums the
  step times in closed form (`ExecModel.sum_decode_steps_ms`).
* Other steps (prefill chunks, admissions, preemptions) run one by one, touching
  only the prefilling requests unless a decode must be preempted.

Expected future arrivals (`FutureLoad`) join the waiting queue at the first step that starts
at or after their arrival time. A stable decode phase is cut at that step only if the arrival
could be admitted there (nothing waits ahead of it, a seat and its blocks are free); otherwise
it only lengthens the queue's tail, which no step of the phase looks at, and it is queued when
the phase ends.

It relies on the shape vLLM's running list always has: decodes first, then the
requests still prefilling (see `snapshot.prepare`), and on every running decode
fitting in each step's token budget (``max_num_batched_tokens >= max_num_seqs``).

Under the "priority" policy (``InstanceConfig.scheduling_policy``) waiting requests are
kept in priority order and a preemption takes the running request with the largest
priority, wherever it stands, as `Scheduler` does: a decode victim that already got
this step's block frees it too, a victim already scheduled gives its tokens back, and a
decode that preempts itself stops the step there (the decodes behind it skip the step).
Expected future arrivals get the priority the engine would give them: their arrival
(after the target's) plus their predicted length (`request_priority`). The seat reserve
(`InstanceConfig.num_interactive_seats`) holds a waiting batch-class request back while
``max_num_seqs - num_interactive_seats`` or more requests run, and a running batch request
gives its seat up to an interactive one heading the queue when every seat is taken, as
`Scheduler` does; with
``batch_prefill_last`` each explicit step first moves prefilling batch requests to the end of
the prefills (decodes are never moved, as in `Scheduler`), and out of the step while an
interactive request waits.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence

from .batch_rules import (
    PRIORITY_CLASS_SPAN_MS,
    has_seat,
    is_late_batch_prefill,
    put_batch_prefills_last,
    seat_to_yield,
)
from .block_pool import BlockPool
from .exec_model import ExecModel
from .future_load import FUTURE_ID_PREFIX, NO_FUTURE_LOAD, FutureLoad
from .result import WhatIf
from .snapshot import PreparedInstance, SeqSpec, request_priority

__all__ = ["FastSim"]

#: Guard against a schedule that never makes progress (an invariant, not a limit).
MAX_ITERATIONS = 10_000_000


class _Seq:
    """Mutable per-request state; decodes keep only their anchor up to date."""

    __slots__ = ("request_id", "num_prompt_tokens", "max_output_tokens", "num_output_tokens",
                 "num_computed_tokens", "num_shared_blocks", "num_owned_blocks", "is_target",
                 "is_decoding", "anchor_step", "anchor_tokens", "residue", "serial",
                 "is_future", "priority", "prefix_keys", "num_prefix_held", "prefix_open")

    def __init__(self, spec: SeqSpec) -> None:
        self.request_id = spec.request_id
        self.num_prompt_tokens = spec.num_prompt_tokens
        self.max_output_tokens = spec.max_output_tokens
        self.num_output_tokens = spec.num_output_tokens
        self.num_computed_tokens = spec.num_computed_tokens
        self.num_shared_blocks = spec.num_shared_blocks
        self.num_owned_blocks = spec.num_owned_blocks
        self.is_target = spec.is_target
        self.is_decoding = False
        self.anchor_step = self.anchor_tokens = self.residue = 0
        self.serial = -1  # identifies the current decode anchor in the finish heap
        self.is_future = False  # an expected future arrival (`FutureLoad`)
        self.priority = spec.priority
        # Prefix caching by keys, as `SeqState` has them.
        self.prefix_keys = spec.prefix_keys
        self.num_prefix_held = 0
        self.prefix_open = True


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _finish_step(seq: _Seq) -> int:
    """The step a decode anchored as it is produces its last token in."""
    return seq.anchor_step + seq.max_output_tokens - seq.num_output_tokens - 1


def _is_late(seq: _Seq) -> bool:
    return is_late_batch_prefill(seq.priority, seq.num_prompt_tokens + seq.num_output_tokens,
                                 seq.num_computed_tokens)


def _priority_key(seq: _Seq) -> tuple[int]:
    return (seq.priority,)


class _Restored:
    """A prepared instance's running decodes as `FastSim._start_decoding` anchors them at step
    0 (rows in running order: spec, tokens, block residue, serial), their finish heap (entries
    hold row indexes) and totals: the same for every what-if on the instance, so derived once
    (a block_slo decision runs a what-if on every instance, and restoring the decodes one by
    one took a fifth of a planning run)."""

    __slots__ = ("heap", "residue_counts", "rows", "tokens_base")

    def __init__(self, running: Sequence[SeqSpec], block_size: int) -> None:
        self.rows: list[tuple[SeqSpec, int, int, int]] = []
        self.heap: list[tuple[int, int, int]] = []
        self.residue_counts = [0] * block_size
        self.tokens_base = 0
        for index, spec in enumerate(running):
            if spec.is_prefilling:  # decodes come first (`snapshot.prepare`)
                break
            num_tokens = spec.num_prompt_tokens + spec.num_output_tokens
            residue = (1 - num_tokens) % block_size
            serial = index + 1
            self.rows.append((spec, num_tokens, residue, serial))
            self.heap.append((spec.max_output_tokens - spec.num_output_tokens - 1, serial, index))
            self.residue_counts[residue] += 1
            self.tokens_base += num_tokens
        self.heap.sort()  # a sorted list is a heap

    @staticmethod
    def of(instance: PreparedInstance) -> _Restored | None:
        """The instance's restored decodes (None where a running request has prefix keys:
        those are restored with the pool's prefix cache, one by one)."""
        derived = instance.derived
        if "restored" not in derived:
            derived["restored"] = (
                None if any(spec.prefix_keys for spec in instance.running)
                else _Restored(instance.running, instance.config.block_size))
        return derived["restored"]


class FastSim:
    """One what-if run: load a prepared instance and the target, run until it finishes."""

    def __init__(self, instance: PreparedInstance, target: SeqSpec,
                 exec_model: ExecModel, future: FutureLoad = NO_FUTURE_LOAD,
                 arrival_ms: int = 0) -> None:
        """`arrival_ms`: the target's arrival in the priorities' ms (priority policy only:
        expected future arrivals come that many ms after it)."""
        config = instance.config
        self.exec_model = exec_model
        self.block_size = config.block_size
        self.max_num_seqs = config.max_num_seqs
        self.token_budget = config.max_num_batched_tokens
        self.num_usable_blocks = config.num_usable_blocks
        self.watermark_blocks = config.num_watermark_blocks
        self.prefix_caching = config.enable_prefix_caching
        self.reserve_full_input = config.reserve_full_input
        self.pool = BlockPool(instance.num_free_blocks, track_owners=config.enable_prefix_caching,
                              unit_blocks=config.prefix_unit_blocks)
        self.prefix_unit_tokens = config.prefix_unit_tokens
        # Running: decodes are running[:num_decoding], prefills follow.
        self.running: list[_Seq] = []
        self.target = _Seq(target)
        self.is_priority = config.is_priority
        #: Seats kept for interactive requests (`batch_rules.has_seat`).
        self.num_interactive_seats = config.num_interactive_seats if config.is_priority else 0
        self.batch_prefill_last = config.is_priority and config.batch_prefill_last
        #: Whether batch requests give their seats up to interactive ones (the seat rule).
        self.batch_yields_seats = config.is_priority and config.num_interactive_seats > 0
        #: Running requests sitting the current step out (`_put_batch_prefills_last`), and
        #: whether some sat the last step out (then they run in this one).
        self.num_aside = 0
        self.sat_out_last_step = False
        self.priority_ms_per_token = config.priority_ms_per_token
        self.arrival_ms = arrival_ms
        self.waiting: deque[_Seq] = deque(_Seq(s) for s in instance.waiting)
        self._enqueue(self.target)
        self.num_decoding = 0
        #: Restored decodes whose next step may complete a prefix unit (`_single_step`).
        self.pending_units: list[_Seq] = []
        self.residue_counts = [0] * config.block_size
        self.decode_tokens_base = 0  # sum of (anchor_tokens - anchor_step) over decodes
        self.finish_heap: list[tuple[int, int, _Seq]] = []
        self.next_serial = 0
        self.step = 0
        self.now_s = 0.0
        #: Requests of the snapshot, and the target, not finished yet (expected future
        #: arrivals are not counted: `WhatIf.delay_to_others_s` is about these).
        self.num_unfinished = len(instance.running) + len(self.waiting)
        self.num_preemptions = 0
        self.ttft_s: float | None = None
        self.queueing_s: float | None = None
        self.e2e_s: float | None = None
        self.delay_to_others_s = 0.0
        restored = _Restored.of(instance)
        if restored is not None:
            self._restore(restored, instance.running)
        else:
            self._restore_one_by_one(instance.running)
        self.future = future
        self.num_arrived = 0
        self.next_arrival_s = math.inf
        if future.active:
            self.future_spec = future.spec(config)
            self.future_seq = _Seq(self.future_spec)  # a template, for admission checks
            self.next_arrival_s = future.arrival_s(0)

    def _restore(self, restored: _Restored, running: Sequence[SeqSpec]) -> None:
        """Load the snapshot's running requests, its decodes anchored as `restored` has them
        (what `_restore_one_by_one` computes, once per prepared instance)."""
        decodes = []
        for spec, num_tokens, residue, serial in restored.rows:
            seq = _Seq(spec)
            seq.is_decoding = True
            seq.anchor_tokens = num_tokens
            seq.residue = residue
            seq.serial = serial
            decodes.append(seq)
        self.finish_heap = [(step, serial, decodes[i]) for step, serial, i in restored.heap]
        self.num_decoding = self.next_serial = len(decodes)
        self.running = decodes
        self.running.extend(_Seq(spec) for spec in running[len(decodes):])
        self.residue_counts = list(restored.residue_counts)
        self.decode_tokens_base = restored.tokens_base

    def _restore_one_by_one(self, running: Sequence[SeqSpec]) -> None:
        """Load the snapshot's running requests, caching their prefix units."""
        for spec in running:
            seq = _Seq(spec)
            self.running.append(seq)
            if seq.prefix_keys:
                self._cache_units(seq, seq.num_computed_tokens)
                if not spec.is_prefilling and seq.prefix_open:
                    # Its last prompt token may complete a unit in its first decode step.
                    self.pending_units.append(seq)
            if not spec.is_prefilling:
                self._start_decoding(seq, 0)

    # -- driver -------------------------------------------------------------------------
    def run(self) -> WhatIf:
        """Simulate until the target request produces its last token."""
        for _ in range(MAX_ITERATIONS):
            if self.e2e_s is not None:
                break
            if self.now_s >= self.next_arrival_s:
                self._arrive()
            if self._drainable():
                self._drain()
            elif not self._fast_forward():
                self._single_step()
        else:  # pragma: no cover - invariant
            raise AssertionError("simulation made no progress")
        assert self.ttft_s is not None and self.queueing_s is not None
        return WhatIf(self.ttft_s, self.e2e_s, self.queueing_s, self.delay_to_others_s,
                      self.step, self.num_preemptions)

    # -- expected future arrivals -------------------------------------------------------
    def _arrive(self) -> None:
        """Queue every expected arrival due by now (behind everything waiting)."""
        future = self.future
        spec = self.future_spec
        while self.next_arrival_s <= self.now_s:
            seq = _Seq(spec)
            seq.request_id = f"{FUTURE_ID_PREFIX}{self.num_arrived}"
            seq.is_future = True
            seq.priority = self._future_priority(self.num_arrived)
            self._enqueue(seq)
            self.num_arrived += 1
            self.next_arrival_s = future.arrival_s(self.num_arrived)

    def _future_priority(self, index: int) -> int:
        """The engine's priority of the `index`-th expected arrival (priority policy)."""
        return self.arrival_ms + request_priority(
            self.future.arrival_s(index), round(self.future.num_output_tokens),
            self.priority_ms_per_token)

    def _enqueue(self, seq: _Seq) -> None:
        """Queue a new arrival: last (FCFS), or behind every priority not larger."""
        waiting = self.waiting
        if not self.is_priority:
            waiting.append(seq)
            return
        index = len(waiting)
        while index and waiting[index - 1].priority > seq.priority:
            index -= 1
        waiting.insert(index, seq)

    def _arrival_may_join(self, num_free: int) -> bool:
        """Whether an arrival could be admitted in a decode-only phase: with `num_free`
        blocks, nothing waiting ahead of it and a seat free (both hold through the phase)."""
        priority = self._future_priority(self.num_arrived)
        if not self._has_seat(priority):
            return False
        if self.waiting and (not self.is_priority or self.waiting[0].priority <= priority):
            return False
        budget = self.token_budget - self.num_decoding
        return budget > 0 and self._admission_plan(self.future_seq, budget, num_free) is not None

    def _steps_before_arrival(self, context: int, max_steps: int, num_free: int) -> int:
        """Decode-only steps (<= max_steps) to run before the next arrival joins.

        The arrival joins the first step that starts at or after it: run the smallest n
        whose n steps end at or after it (every one of them started before it), unless it
        could not be admitted then anyway (`num_free`: blocks free after the first step).
        """
        due_ms = (self.next_arrival_s - self.now_s) * 1000.0
        model = self.exec_model
        num_decoding = self.num_decoding
        sum_ms = model.sum_decode_steps_ms
        if (sum_ms(num_decoding, context, max_steps) < due_ms
                or not self._arrival_may_join(num_free)):
            return max_steps
        # The sum is quadratic in n (context grows each step): solve, then settle exactly
        # on the same sums the phase will add up.
        base = model.decode_base_ms(num_decoding)
        slope = model.decode_context_ms
        a = slope * num_decoding / 2.0
        b = base + slope * (context - num_decoding / 2.0)
        if a > 0.0:
            estimate = (-b + math.sqrt(b * b + 4.0 * a * due_ms)) / (2.0 * a)
        else:
            estimate = due_ms / b if b > 0.0 else 1.0
        n = min(max(1, math.ceil(estimate)), max_steps)
        while n > 1 and sum_ms(num_decoding, context, n - 1) >= due_ms:
            n -= 1
        while n < max_steps and sum_ms(num_decoding, context, n) < due_ms:
            n += 1
        return n

    # -- implicit decodes -----------------------------------------------------------------
    def _start_decoding(self, seq: _Seq, step: int) -> None:
        """Anchor `seq` as a decode from `step` on (it must be running[num_decoding])."""
        assert self.running[self.num_decoding] is seq
        num_tokens = seq.num_prompt_tokens + seq.num_output_tokens
        seq.is_decoding = True
        seq.anchor_step = step
        seq.anchor_tokens = num_tokens
        # A decode needs a new block when its length before the step is a multiple
        # of the block size, i.e. on steps congruent to this residue.
        seq.residue = (step - num_tokens + 1) % self.block_size
        finish_step = _finish_step(seq)
        self.next_serial += 1
        seq.serial = self.next_serial
        self.residue_counts[seq.residue] += 1
        self.decode_tokens_base += num_tokens - step
        self.num_decoding += 1
        heapq.heappush(self.finish_heap, (finish_step, seq.serial, seq))

    def _stop_decoding(self, seq: _Seq, num_tokens: int) -> None:
        """Turn `seq` back into an explicit sequence whose tokens all but one are computed."""
        seq.is_decoding = False
        seq.serial = -1
        seq.num_output_tokens = num_tokens - seq.num_prompt_tokens
        seq.num_computed_tokens = num_tokens - 1
        self.residue_counts[seq.residue] -= 1
        self.decode_tokens_base -= seq.anchor_tokens - seq.anchor_step
        self.num_decoding -= 1

    def _decode_tokens_at(self, seq: _Seq, step: int) -> int:
        return seq.anchor_tokens + step - seq.anchor_step

    def _next_finish_step(self) -> int:
        heap = self.finish_heap
        while heap[0][2].serial != heap[0][1]:
            heapq.heappop(heap)
        return heap[0][0]

    # -- stable decode phases -------------------------------------------------------------
    def _fast_forward(self) -> bool:
        """Jump over decode-only steps up to the next event; False if none can be skipped."""
        num_decoding = self.num_decoding
        if not num_decoding or len(self.running) != num_decoding or self.pending_units:
            return False
        step = self.step
        num_free = self.pool.num_free
        first_need = self.residue_counts[step % self.block_size]
        if (first_need > num_free or self._head_reuse_may_grow()
                or self._admission_possible(num_free - first_need)
                or self._seat_to_yield() is not None):
            return False
        max_steps = self._next_finish_step() - step + 1
        if self.next_arrival_s != math.inf:
            max_steps = self._steps_before_arrival(
                self.decode_tokens_base + num_decoding * step, max_steps, num_free - first_need)
        num_steps, num_blocks = self._steps_within(num_free, max_steps)
        self._advance_decodes(num_steps, num_blocks)
        return True

    # -- the last phase: only decodes, none preempted, until the target's last token ------
    def _drainable(self) -> bool:
        """Whether the rest of the run is decode phases alone: the target decodes, nothing
        waits or will arrive, and the free blocks cover every decode's growth until the
        target's last step (a block every `block_size` steps each at most; blocks freed on
        the way only add room), so nothing is admitted, preempted or sat out."""
        if (not self.target.is_decoding or self.waiting or self.pending_units or self.num_aside
                or self.next_arrival_s != math.inf or len(self.running) != self.num_decoding):
            return False
        num_steps = _finish_step(self.target) - self.step + 1
        return self.num_decoding * _cdiv(num_steps, self.block_size) <= self.pool.num_free

    def _drain(self) -> None:
        """Run the decode phases up to the target's last token as `_fast_forward` would (the
        same sums in the same order: the same figures), without the per-phase bookkeeping of
        the requests that finish before it."""
        last = _finish_step(self.target)
        # NOTE: (finish step, serial, seq): serials are unique, so no seqs are compared.
        finishing = sorted(e for e in self.finish_heap if e[2].serial == e[1] and e[0] <= last)
        model = self.exec_model
        step, now_s, delay_s = self.step, self.now_s, self.delay_to_others_s
        num_decoding, num_unfinished = self.num_decoding, self.num_unfinished
        tokens_base = self.decode_tokens_base
        index = 0
        while True:
            finish_step = finishing[index][0]
            num_steps = finish_step - step + 1
            duration_ms = model.sum_decode_steps_ms(num_decoding, tokens_base
                                                    + num_decoding * step, num_steps)
            if num_unfinished > 1:
                delay_s += (self._target_decode_ms(num_decoding, step, num_steps) / 1000.0
                            * (num_unfinished - 1))
            now_s += duration_ms / 1000.0
            step = finish_step + 1
            if finish_step == last:
                break
            while finishing[index][0] == finish_step:
                seq = finishing[index][2]
                tokens_base -= seq.anchor_tokens - seq.anchor_step
                num_decoding -= 1
                num_unfinished -= not seq.is_future
                index += 1
        self.step, self.now_s, self.delay_to_others_s = step, now_s, delay_s
        self.e2e_s = now_s

    def _admission_possible(self, num_free: int) -> bool:
        if not self.waiting or not self._has_seat(self.waiting[0].priority):
            return False
        budget = self.token_budget - self.num_decoding
        return budget > 0 and self._admission_plan(self.waiting[0], budget, num_free) is not None

    def _head_reuse_may_grow(self) -> bool:
        # NOTE: without the full-input admission check a head request with cached
        # blocks (its own, or prefix units) needs fewer new blocks as they are evicted,
        # even by the step's own decode blocks, so it may become admissible while blocks
        # shrink; run single steps then (rare setting).
        return (self.prefix_caching and not self.reserve_full_input and bool(self.waiting)
                and (self.pool.num_cached(self.waiting[0].request_id) > 0
                     or bool(self.waiting[0].prefix_keys)))

    def _steps_within(self, num_free: int, max_steps: int) -> tuple[int, int]:
        """Most decode steps (<= max_steps) whose new blocks fit in `num_free`, and the blocks.

        Each decode needs exactly one block every `block_size` steps, so whole cycles
        cost `num_decoding` blocks; only the last partial cycle is walked.
        """
        block_size = self.block_size
        num_decoding = self.num_decoding
        cycles = min(max_steps // block_size, num_free // num_decoding)
        num_steps = cycles * block_size
        num_blocks = cycles * num_decoding
        counts = self.residue_counts
        start = self.step % block_size
        for offset in range(min(max_steps - num_steps, block_size)):
            need = counts[(start + offset) % block_size]
            if num_blocks + need > num_free:
                return num_steps + offset, num_blocks
            num_blocks += need
        return min(max_steps, num_steps + block_size), num_blocks

    def _advance_decodes(self, num_steps: int, num_blocks: int) -> None:
        """Run `num_steps` identical decode-only steps, then retire who finished."""
        if num_steps:
            self.sat_out_last_step = False  # no prefill in them to sit out
        model = self.exec_model
        step = self.step
        num_decoding = self.num_decoding
        context = self.decode_tokens_base + num_decoding * step
        duration_ms = model.sum_decode_steps_ms(num_decoding, context, num_steps)
        if self.target.is_decoding and self.num_unfinished > 1:
            self.delay_to_others_s += (self._target_decode_ms(num_decoding, step, num_steps)
                                       / 1000.0 * (self.num_unfinished - 1))
        self.pool.allocate(num_blocks)
        self.now_s += duration_ms / 1000.0
        self.step = step + num_steps
        self._retire_decodes(step + num_steps - 1)

    def _target_decode_ms(self, num_decoding: int, step: int, num_steps: int) -> float:
        """What the decoding target adds to `num_steps` decode steps of `num_decoding` from
        `step` on (its marginal share of each): the delay it causes each other request."""
        model = self.exec_model
        marginal_ms = model.decode_base_ms(num_decoding) - model.decode_base_ms(num_decoding - 1)
        first_tokens = self._decode_tokens_at(self.target, step)
        return (num_steps * marginal_ms + model.decode_context_ms
                * (num_steps * first_tokens + num_steps * (num_steps - 1) // 2))

    def _retire_decodes(self, step: int) -> None:
        """Finish the decodes whose last token came out of `step`."""
        heap = self.finish_heap
        while heap and heap[0][0] == step:
            _, serial, seq = heapq.heappop(heap)
            if seq.serial != serial:
                continue
            num_tokens = self._decode_tokens_at(seq, step)
            self._stop_decoding(seq, num_tokens)
            self.running.remove(seq)
            seq.num_computed_tokens = num_tokens
            seq.num_owned_blocks = _cdiv(num_tokens, self.block_size) - seq.num_shared_blocks
            self._release(seq)
            self._finished(seq)

    def _release(self, seq: _Seq, owner: str | None = None) -> None:
        """Free `seq`'s blocks; full ones stay cached (for `owner`, if given); then its prefix
        units (vLLM frees a request's blocks tail first)."""
        full = seq.num_computed_tokens // self.block_size - seq.num_shared_blocks
        self.pool.release(seq.num_owned_blocks, min(max(full, 0), seq.num_owned_blocks), owner)
        seq.num_owned_blocks = 0
        if seq.prefix_keys:
            self.pool.release_prefix(seq.prefix_keys[:seq.num_prefix_held])
            seq.num_shared_blocks = 0

    def _cache_units(self, seq: _Seq, num_computed: int) -> None:
        self.pool.cache_computed_units(seq, num_computed, self.prefix_unit_tokens)

    def _finished(self, seq: _Seq) -> None:
        if not seq.is_future:
            self.num_unfinished -= 1
        if seq.is_target:
            self.e2e_s = self.now_s

    # -- one explicit step ----------------------------------------------------------------
    def _single_step(self) -> None:
        step = self.step
        preemptions_before = self.num_preemptions
        if not self.running:
            self._reclaim_idle_blocks()
        aside: list[_Seq] = []
        if self.running and self.batch_prefill_last:
            aside = self._put_batch_prefills_last()
            self.num_aside = len(aside)
        victim = self._seat_to_yield()
        if victim is not None:
            self._preempt(victim, step)
            preemptions_before = self.num_preemptions  # a yielded seat stops no admission
        chunks: list[tuple[_Seq, int, int]] = []  # (seq, new tokens, computed before)
        skipped = self._schedule_decodes(step)
        if self.pending_units:  # decodes: ahead of the prefills in the running order
            self._cache_pending_units(skipped or ())
        if skipped is None:
            preempted = self.num_preemptions > preemptions_before
            budget = self.token_budget - self.num_decoding
            budget, preempted = self._schedule_prefills(budget, chunks, preempted)
            if not preempted:
                self._schedule_waiting(budget, chunks)
        if aside:
            self.running.extend(aside)
            self.num_aside = 0
        self._execute(step, chunks)
        for seq in skipped or ():
            self._start_decoding(seq, step + 1)
        self.step = step + 1
        self._retire_decodes(step)
        self._update_prefills(chunks, step)

    def _interactive_waits(self) -> bool:
        return bool(self.waiting) and self.waiting[0].priority < PRIORITY_CLASS_SPAN_MS

    def _put_batch_prefills_last(self) -> list[_Seq]:
        """Batch prefills last (`batch_rules.put_batch_prefills_last`) among the prefills
        (decodes never move): those sitting this step out."""
        prefills = self.running[self.num_decoding:]
        aside, self.sat_out_last_step = put_batch_prefills_last(
            prefills, _is_late, self._interactive_waits(), self.sat_out_last_step)
        self.running[self.num_decoding:] = prefills
        return aside

    def _seat_to_yield(self) -> _Seq | None:
        """The running batch request that gives its seat up to the interactive request
        heading the queue, when every seat is taken (`batch_rules.seat_to_yield`; the
        snapshot's arrivals are in the priorities, so the key is the priority alone)."""
        if not self.batch_yields_seats:
            return None
        return seat_to_yield(self.running, self.num_aside, self.max_num_seqs,
                             self._interactive_waits(), _priority_key)

    def _cache_pending_units(self, skipped: Sequence[_Seq]) -> None:
        """Register the units restored decodes completed in this step (those that ran)."""
        waiting = []
        for seq in self.pending_units:
            if seq in skipped:
                waiting.append(seq)
            elif seq.is_decoding:
                self._cache_units(seq, self._decode_tokens_at(seq, self.step))
        self.pending_units = waiting

    def _reclaim_idle_blocks(self) -> None:
        missing = self.num_usable_blocks - self.pool.num_free
        if missing > 0:
            self.pool.free(missing, reusable=False)

    def _schedule_decodes(self, step: int) -> list[_Seq] | None:
        """Give each decode its block (preempting when they run out).

        None, or when a decode preempted itself (priority policy: it had the largest
        priority), the decodes behind it, which skip this step: they are taken out of the
        decode batch (to rejoin it at the next step) and nothing else is scheduled.
        """
        if not self.num_decoding:
            return None
        block_size = self.block_size
        pool = self.pool
        need = self.residue_counts[step % block_size]
        if need <= pool.num_free:
            pool.allocate(need)
            return None
        # Blocks run out inside the decode batch: walk it in order, as vLLM does.
        running = self.running
        index = 0
        while index < self.num_decoding:
            seq = running[index]
            if (self._decode_tokens_at(seq, step) - 1) % block_size == 0:
                victim = None
                while pool.num_free < 1:
                    victim, victim_index = self._victim()
                    # A decode ahead of `seq` has its block for this step already.
                    self._preempt(victim, step, victim_index < index)
                    if victim_index < index:
                        index -= 1
                    if victim is seq:
                        break
                if victim is seq:
                    return self._skip_decodes_from(index, step)
                pool.allocate(1)
            index += 1
        return None

    def _skip_decodes_from(self, index: int, step: int) -> list[_Seq]:
        """Take the decodes at running[index:] out of the batch for this step."""
        skipped = self.running[index:self.num_decoding]
        for seq in reversed(skipped):
            self._stop_decoding(seq, self._decode_tokens_at(seq, step))
        return skipped

    def _victim(self) -> tuple[_Seq, int]:
        """The running request to preempt, and its index: the last one (FCFS), or the
        first with the largest priority."""
        running = self.running
        if not self.is_priority:
            return running[-1], len(running) - 1
        index = max(range(len(running)), key=lambda i: running[i].priority)
        return running[index], index

    def _schedule_prefills(self, budget: int, chunks: list[tuple[_Seq, int, int]],
                           preempted: bool) -> tuple[int, bool]:
        running = self.running
        pool = self.pool
        block_size = self.block_size
        index = self.num_decoding
        while index < len(running) and budget > 0:
            seq = running[index]
            computed = seq.num_computed_tokens
            num_new = min(seq.num_prompt_tokens + seq.num_output_tokens - computed, budget)
            need = (_cdiv(computed + num_new, block_size) - seq.num_shared_blocks
                    - seq.num_owned_blocks)
            victim = None
            while need > pool.num_free:
                victim, victim_index = self._victim()
                if victim_index < index:  # priority policy: already scheduled this step
                    index -= 1
                    budget += self._unschedule(victim, chunks)
                self._preempt(victim, self.step, True)
                preempted = True
                if victim is seq:
                    break
            if victim is seq:
                break
            pool.allocate(need)
            seq.num_owned_blocks += need
            chunks.append((seq, num_new, computed))
            if seq.prefix_open and seq.prefix_keys:
                self._cache_units(seq, computed + num_new)
            budget -= num_new
            index += 1
        return budget, preempted

    def _unschedule(self, seq: _Seq, chunks: list[tuple[_Seq, int, int]]) -> int:
        """Take `seq` (a decode, or a prefill chunk in `chunks`) out of this step: the
        tokens it gives back."""
        if seq.is_decoding:
            return 1
        for position, chunk in enumerate(chunks):
            if chunk[0] is seq:
                del chunks[position]
                return chunk[1]
        raise AssertionError(f"{seq.request_id} was not scheduled")

    def _has_seat(self, priority: int) -> bool:
        """Whether a seat is free for a request of `priority` (a batch-class one: outside the
        interactive reserve)."""
        return has_seat(len(self.running) + self.num_aside, self.max_num_seqs,
                        self.num_interactive_seats, priority)

    def _schedule_waiting(self, budget: int, chunks: list[tuple[_Seq, int, int]]) -> None:
        waiting = self.waiting
        while budget > 0 and waiting and self._has_seat(waiting[0].priority):
            plan = self._admission_plan(waiting[0], budget, self.pool.num_free)
            if plan is None:
                return
            num_new, computed, reused, num_blocks, hit_units = plan
            seq = waiting.popleft()
            if hit_units:
                self.pool.acquire_prefix(seq.prefix_keys[:hit_units])
            if self.prefix_caching:
                self.pool.reclaim(seq.request_id, reused)
            self.pool.allocate(num_blocks - reused)
            if seq.prefix_keys:
                seq.num_shared_blocks = hit_units * self.pool.unit_blocks
                seq.num_prefix_held = hit_units
                seq.prefix_open = True
            seq.num_owned_blocks = num_blocks
            seq.num_computed_tokens = computed
            self.running.append(seq)
            chunks.append((seq, num_new, computed))
            if seq.prefix_keys:
                self._cache_units(seq, computed + num_new)
            budget -= num_new

    def _admission_plan(self, seq: _Seq, budget: int,
                        num_free: int) -> tuple[int, int, int, int, int] | None:
        """(new tokens, computed tokens, reused own blocks, blocks to hold, prefix units
        hit) or None; as `Scheduler._try_admit` decides."""
        block_size = self.block_size
        num_tokens = seq.num_prompt_tokens + seq.num_output_tokens
        shared = seq.num_shared_blocks
        reused = hit_units = queue_hit = 0
        if self.prefix_caching:
            max_hit_blocks = (num_tokens - 1) // block_size
            if seq.prefix_keys:
                hit_units, queue_hit = self.pool.match_prefix(
                    seq.prefix_keys, max_hit_blocks // self.pool.unit_blocks)
                shared = hit_units * self.pool.unit_blocks
            if hit_units >= seq.num_prefix_held:
                reused = min(self.pool.num_cached(seq.request_id), max_hit_blocks - shared)
        computed = (shared + reused) * block_size
        num_new = min(num_tokens - computed, budget)
        watermark = self.watermark_blocks if self.running else 0
        if self.reserve_full_input and (
                _cdiv(num_tokens, block_size) - shared + queue_hit + watermark > num_free):
            return None
        num_blocks = _cdiv(computed + num_new, block_size) - shared
        if num_blocks + queue_hit + watermark > num_free:
            return None
        return num_new, computed, reused, num_blocks, hit_units

    def _preempt(self, seq: _Seq, step: int, decode_block_given: bool = False) -> None:
        """Drop a running request's KV and put it back in waiting: first (FCFS), or in its
        priority's place. `decode_block_given`: a decode got this step's block already."""
        if self.running[-1] is seq:
            self.running.pop()
        else:
            self.running.remove(seq)
        if seq.is_decoding:
            num_tokens = self._decode_tokens_at(seq, step)
            self._stop_decoding(seq, num_tokens)
            held = num_tokens if decode_block_given else num_tokens - 1
            seq.num_owned_blocks = _cdiv(held, self.block_size) - seq.num_shared_blocks
        self._release(seq, seq.request_id if self.prefix_caching else None)
        seq.num_computed_tokens = 0
        self.num_preemptions += 1
        if self.is_priority:
            self._enqueue(seq)
        else:
            self.waiting.appendleft(seq)

    def _execute(self, step: int, chunks: list[tuple[_Seq, int, int]]) -> None:
        """Price the step, and account for the target if it ran in it."""
        num_decodes = self.num_decoding
        decode_context = self.decode_tokens_base + num_decodes * step
        prefill_tokens = prefill_seqs = chunk_x_context = chunk_sq = 0
        target_part: tuple[int, int, int, int, int, int] | None = None
        target = self.target
        if target.is_decoding:
            target_part = (0, 1, 0, self._decode_tokens_at(target, step), 0, 0)
        for seq, num_new, computed in chunks:
            num_tokens = seq.num_prompt_tokens + seq.num_output_tokens
            if num_new == 1 and computed == num_tokens - 1:
                part = (0, 1, 0, num_tokens, 0, 0)
            else:
                part = (num_new, 0, 1, 0, num_new * computed, num_new * num_new)
            prefill_tokens += part[0]
            num_decodes += part[1]
            prefill_seqs += part[2]
            decode_context += part[3]
            chunk_x_context += part[4]
            chunk_sq += part[5]
            if seq is target:
                target_part = part
        totals = (prefill_tokens, num_decodes, prefill_seqs, decode_context, chunk_x_context,
                  chunk_sq)
        duration_ms = self.exec_model.step_ms_of(*totals)
        if target_part is not None:
            if self.queueing_s is None:
                self.queueing_s = self.now_s
            if self.num_unfinished > 1:
                rest = [a - b for a, b in zip(totals, target_part)]
                extra_ms = duration_ms - self.exec_model.step_ms_of(*rest)
                self.delay_to_others_s += extra_ms / 1000.0 * (self.num_unfinished - 1)
        self.now_s += duration_ms / 1000.0

    def _update_prefills(self, chunks: list[tuple[_Seq, int, int]], step: int) -> None:
        """Advance scheduled chunks; complete prefills sample a token and start decoding."""
        for seq, num_new, _ in chunks:
            seq.num_computed_tokens += num_new
            if seq.num_computed_tokens < seq.num_prompt_tokens + seq.num_output_tokens:
                continue
            seq.num_output_tokens += 1
            if seq.is_target and self.ttft_s is None:
                self.ttft_s = self.now_s
            if seq.num_output_tokens >= seq.max_output_tokens:
                self.running.remove(seq)
                self._release(seq)
                self._finished(seq)
            else:
                self._start_decoding(seq, step + 1)
