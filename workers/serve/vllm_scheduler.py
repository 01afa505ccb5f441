"""vLLM's scheduler with the engines' batch rules: batch prefills last, and seats that batch
work gives up to interactive requests.

vLLM v1 schedules running requests before waiting ones, in the order they started, so a batch
line's long prefill took the step's token budget (512) ahead of an interactive request that
arrived after it, for as many steps as its prompt needs; and it preempts only for KV blocks, so
an interactive request that finds every seat taken by batch lines waits for one of their
answers to end. The classes here change only vLLM's running list at the start of each step, as
the simulator models it:

- batch prefills last (`workers.sim.InstanceConfig.batch_prefill_last`): running batch-class
  requests (`workers.sim.batch_rules.is_late_batch_prefill`: priority of the batch class, more
  than one token to compute) go after every other running request; while an interactive
  request waits, they sit the step out: out of the running list while vLLM schedules it, with
  the seats they hold taken off vLLM's limits, so that they are neither scheduled nor
  preempted; never two steps in a row, so that an interactive request vLLM cannot admit (no KV
  blocks) stops no one;
- seats yielded (with `workers.sim.InstanceConfig.num_interactive_seats`, whose reserve the
  engine keeps by holding batch requests back): when an interactive request heads the queue
  and every seat is taken, the running batch request with the largest priority is preempted
  (vLLM's own recompute preemption) before vLLM schedules the step, one a step.

Both rules, and their tie-breaks, are `workers.sim.batch_rules`', which the simulator applies
too. vLLM loads the class by its dotted path (`scheduler_cls`, which `scheduler_class` names for
the rules in force); this module imports vLLM, so nothing else imports it.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from vllm.v1.core.sched.scheduler import Scheduler

from workers.sim.batch_rules import (
    PRIORITY_CLASS_SPAN_MS,
    is_late_batch_prefill,
    put_batch_prefills_last,
    seat_to_yield,
)

__all__ = ["BatchRulesScheduler", "scheduler_class"]


class BatchRulesScheduler(Scheduler):
    """vLLM's `Scheduler` with both batch rules (module docstring); the subclasses below turn
    one off."""

    prefill_last: ClassVar[bool] = True
    yields_seats: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Whether batch prefills sat the last step out (they run in this one).
        self.sat_out_last_step = False

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        aside = self._put_batch_prefills_last() if self.prefill_last else []
        if self.yields_seats:
            self._yield_a_seat(len(aside))
        if not aside:
            return super().schedule(*args, **kwargs)
        num_aside = len(aside)
        # NOTE: their seats stay taken: vLLM's limits shrink while they are out of the list.
        self.max_num_running_reqs -= num_aside
        self.max_num_active_reqs -= num_aside
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self.max_num_running_reqs += num_aside
            self.max_num_active_reqs += num_aside
            self.running.extend(aside)

    def _put_batch_prefills_last(self) -> list[Any]:
        """Batch prefills last (`batch_rules.put_batch_prefills_last`) on vLLM's running list:
        those sitting this step out."""
        aside, self.sat_out_last_step = put_batch_prefills_last(
            self.running,
            lambda r: is_late_batch_prefill(r.priority, r.num_tokens, r.num_computed_tokens),
            self._interactive_waits(), self.sat_out_last_step)
        return aside

    def _yield_a_seat(self, num_aside: int) -> None:
        """An interactive request heads the queue and every seat is taken (`num_aside` by
        batch prefills sitting out): the running batch request with the largest priority
        gives its seat up (`batch_rules.seat_to_yield`, as the simulator's schedulers)."""
        victim = seat_to_yield(self.running, num_aside, self.max_num_running_reqs,
                               self._interactive_waits(),
                               lambda r: (r.priority, r.arrival_time))
        if victim is None:
            return
        self.running.remove(victim)
        self._preempt_request(victim, time.monotonic())

    def _interactive_waits(self) -> bool:
        """Whether the first request vLLM would admit is interactive."""
        return bool(self.waiting) and self.waiting.peek_request().priority < PRIORITY_CLASS_SPAN_MS


class BatchPrefillLastScheduler(BatchRulesScheduler):
    """Batch prefills last only."""

    yields_seats = False


class SeatYieldingScheduler(BatchRulesScheduler):
    """Seats yielded only."""

    prefill_last = False


def scheduler_class(*, prefill_last: bool, yields_seats: bool) -> str | None:
    """The dotted path of the class with the rules in force (vLLM's ``scheduler_cls``);
    None when neither is: vLLM's own scheduler."""
    cls = {(True, True): BatchRulesScheduler, (True, False): BatchPrefillLastScheduler,
           (False, True): SeatYieldingScheduler}.get((prefill_last, yields_seats))
    return None if cls is None else f"{__name__}.{cls.__qualname__}"
