"""vLLM's scheduler with batch prefills last: interactive prefills take the token budget first.

vLLM v1 schedules running requests before waiting ones, in the order they started, so a batch
line's long prefill took the step's token budget (512) ahead of an interactive request that
arrived after it, for as many steps as its prompt needs. `BatchPrefillLastScheduler` changes
only the order of vLLM's running list at the start of each step, as the simulator models it
(`workers.sim.InstanceConfig.batch_prefill_last`):

- running batch-class requests (`workers.sim.snapshot.is_late_batch_prefill`: priority of the
  batch class, more than one token to compute) go after every other running request;
- while an interactive request waits, they sit the step out: out of the running list while
  vLLM schedules it, with the seats they hold taken off vLLM's limits, so that they are neither
  scheduled nor preempted; never two steps in a row, so that an interactive request vLLM cannot
  admit (no KV blocks) stops no one.

vLLM loads this class by its dotted path (`VllmEngineConfig.batch_prefill_last`); this module
imports vLLM, so nothing else imports it.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

from workers.sim.snapshot import PRIORITY_CLASS_SPAN_MS, is_late_batch_prefill

__all__ = ["BatchPrefillLastScheduler", "SCHEDULER_CLS"]

#: The dotted path vLLM's ``scheduler_cls`` takes.
SCHEDULER_CLS = f"{__name__}.BatchPrefillLastScheduler"


class BatchPrefillLastScheduler(Scheduler):
    """vLLM's `Scheduler`, running batch prefills after everything else (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Whether batch prefills sat the last step out (they run in this one).
        self.sat_out_last_step = False

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        late = [r for r in self.running
                if is_late_batch_prefill(r.priority, r.num_tokens, r.num_computed_tokens)]
        if not late:
            self.sat_out_last_step = False
            return super().schedule(*args, **kwargs)
        late_ids = {id(r) for r in late}
        self.running[:] = [r for r in self.running if id(r) not in late_ids]
        if self.sat_out_last_step or not self._interactive_waits():
            self.sat_out_last_step = False
            self.running.extend(late)
            return super().schedule(*args, **kwargs)
        self.sat_out_last_step = True
        num_aside = len(late)
        # NOTE: their seats stay taken: vLLM's limits shrink while they are out of the list.
        self.max_num_running_reqs -= num_aside
        self.max_num_active_reqs -= num_aside
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self.max_num_running_reqs += num_aside
            self.max_num_active_reqs += num_aside
            self.running.extend(late)

    def _interactive_waits(self) -> bool:
        """Whether the first request vLLM would admit is interactive."""
        return bool(self.waiting) and self.waiting.peek_request().priority < PRIORITY_CLASS_SPAN_MS
