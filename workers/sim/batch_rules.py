"""The engines' batch rules on top of vLLM's scheduler: their one home.

vLLM v1 schedules running requests before waiting ones, in the order they started, and preempts
only for KV blocks. Under the "priority" policy the engines add two rules for batch-class work
(`InstanceConfig.batch_prefill_last`, `InstanceConfig.num_interactive_seats`):

- batch prefills last: at the start of a step, running batch-class requests with more than one
  token to compute (`is_late_batch_prefill`: a prefill, or a recompute after preemption) move
  behind every other running request, order kept; while an interactive request heads the queue
  they sit the step out (out of the running list, their seats still counted, neither scheduled
  nor preempted), never two steps in a row (`put_batch_prefills_last`), so that an interactive
  request that cannot be admitted stops no one;
- seats kept and yielded: a waiting batch-class request is admitted only while fewer than
  ``max_num_seqs - num_interactive_seats`` requests run (`has_seat`); when an interactive request
  heads the queue and every seat is taken, the running batch request with the largest priority
  gives its seat up (preempted by recompute), one a step (`seat_to_yield`).

Every consumer applies them from here: the step scheduler (`workers.sim.scheduler`), the
what-if's event-driven replay (`workers.sim.fastsim`), vLLM's scheduler subclass in the vLLM
engine (`workers.serve.vllm_scheduler`) and that engine's replay of vLLM's order
(`workers.serve.vllm_engine`). The functions take each consumer's own request objects, with
accessors, so that the rules and their tie-breaks are the same code everywhere.

Tie-breaks (the same for every consumer): the victim of `seat_to_yield` is the running batch
request with the largest ``(priority, arrival)``, and among equals the first in the running
list (vLLM's running list is in start order); `put_batch_prefills_last` keeps the running
order within the moved and the unmoved requests.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = [
    "PRIORITY_CLASS_SPAN_MS",
    "has_seat",
    "is_batch_priority",
    "is_late_batch_prefill",
    "put_batch_prefills_last",
    "seat_to_yield",
]

#: Engines put a request's class (0 interactive, 1 batch) above its predicted-shortest-first
#: priority: a class's priorities span less than this many ms (about 30,000 years).
PRIORITY_CLASS_SPAN_MS = 10**15

R = TypeVar("R")


def is_batch_priority(priority: int) -> bool:
    """Whether an engine priority (`workers.sim.snapshot.engine_priority`) is of the batch
    class."""
    return priority >= PRIORITY_CLASS_SPAN_MS


def is_late_batch_prefill(priority: int, num_tokens: int, num_computed_tokens: int) -> bool:
    """Whether a running request goes last under batch-prefills-last: a batch one with more
    than one token still to compute."""
    return priority >= PRIORITY_CLASS_SPAN_MS and num_tokens - num_computed_tokens > 1


def put_batch_prefills_last(running: list[R], is_late: Callable[[R], bool],
                            interactive_waits: bool, sat_out_last_step: bool
                            ) -> tuple[list[R], bool]:
    """Apply batch-prefills-last to `running` in place, at the start of a step.

    The late ones (`is_late`) move behind the others, order kept within both; while an
    interactive request heads the queue and they did not sit the last step out, they leave the
    list for this step instead. Returns (the requests sitting this step out, whether some sat
    it out: the next call's `sat_out_last_step`).
    """
    late = [r for r in running if is_late(r)]
    if not late:
        return [], False
    late_ids = {id(r) for r in late}
    running[:] = [r for r in running if id(r) not in late_ids]
    if interactive_waits and not sat_out_last_step:
        return late, True
    running.extend(late)
    return [], False


def seat_to_yield(running: Sequence[R], num_aside: int, max_num_seqs: int,
                  interactive_waits: bool, priority_key: Callable[[R], tuple[Any, ...]]
                  ) -> R | None:
    """The running batch request that gives its seat up, or None.

    Only when an interactive request heads the queue and every seat is taken (`num_aside`:
    seats of requests sitting the step out). `priority_key` gives ``(priority, arrival)``;
    the largest yields, the first in `running` among equals.
    """
    if not interactive_waits or len(running) + num_aside < max_num_seqs:
        return None
    victim = None
    victim_key = None
    for request in running:
        key = priority_key(request)
        if key[0] < PRIORITY_CLASS_SPAN_MS:
            continue
        if victim_key is None or key > victim_key:  # strictly larger: the first among equals
            victim, victim_key = request, key
    return victim


def has_seat(num_running: int, max_num_seqs: int, num_interactive_seats: int,
             priority: int) -> bool:
    """Whether a waiting request of `priority` may take a seat with `num_running` requests
    running (those sitting a step out included): any free seat for an interactive one, a seat
    outside the interactive reserve for a batch one."""
    if num_running >= max_num_seqs:
        return False
    return priority < PRIORITY_CLASS_SPAN_MS or num_running < max_num_seqs - num_interactive_seats
