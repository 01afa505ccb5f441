"""What if this instance got this request now? Predicted TTFT, end-to-end latency, delays."""

from __future__ import annotations

from .exec_model import BatchStats, ExecModel
from .fastsim import FastSim
from .future_load import FUTURE_ID_PREFIX, NO_FUTURE_LOAD, FutureLoad
from .result import WhatIf
from .scheduler import Scheduler, SeqState
from .snapshot import (
    InstanceConfig,
    InstanceSnapshot,
    OverrunPolicy,
    PreparedInstance,
    SeqSpec,
    SimRequest,
    prepare,
    request_priority,
)

__all__ = ["WhatIf", "predict_what_if", "predict_what_if_prepared", "predict_what_if_stepwise"]


def predict_what_if(snapshot: InstanceSnapshot, new_request: SimRequest, exec_model: ExecModel,
                    overrun: OverrunPolicy = OverrunPolicy(),
                    future: FutureLoad = NO_FUTURE_LOAD) -> WhatIf:
    """Simulate the instance from `snapshot` with `new_request` queued last (under the
    priority policy: in its priority's place), event by event.

    Requests finish at their predicted lengths (corrected by `overrun` for those
    already past them); the run stops when the new request finishes. `future`: the
    requests expected to arrive meanwhile (none by default), queued as they arrive.
    To ask about several new requests against one snapshot, `prepare` it once and call
    `predict_what_if_prepared`.
    """
    return predict_what_if_prepared(prepare(snapshot, overrun), new_request, exec_model, future)


def predict_what_if_prepared(instance: PreparedInstance, new_request: SimRequest,
                             exec_model: ExecModel,
                             future: FutureLoad = NO_FUTURE_LOAD) -> WhatIf:
    """`predict_what_if` on a snapshot already normalised by `prepare`."""
    return FastSim(instance, instance.target(new_request), exec_model, future,
                   _arrival_ms(new_request, instance.config)).run()


def _arrival_ms(new_request: SimRequest, config: InstanceConfig) -> int:
    """The new request's arrival in its priority's ms (what `request_priority` added its
    predicted length to): expected future arrivals come after it. 0 under FCFS."""
    if not config.is_priority:
        return 0
    return new_request.priority - request_priority(0.0, new_request.predicted_output_tokens,
                                                   config.priority_ms_per_token)


def predict_what_if_stepwise(snapshot: InstanceSnapshot, new_request: SimRequest,
                             exec_model: ExecModel,
                             overrun: OverrunPolicy = OverrunPolicy(),
                             future: FutureLoad = NO_FUTURE_LOAD) -> WhatIf:
    """`predict_what_if` by plain step-by-step scheduling: slow, the reference it must match."""
    instance = prepare(snapshot, overrun)
    return _run_stepwise(instance, instance.target(new_request), exec_model, future,
                         _arrival_ms(new_request, instance.config))


def _run_stepwise(instance: PreparedInstance, target_spec: SeqSpec,
                  exec_model: ExecModel, future: FutureLoad, arrival_ms: int) -> WhatIf:
    scheduler = Scheduler(instance.config, instance.num_free_blocks)
    future_spec = future.spec(instance.config) if future.active else None
    num_arrived = num_future_finished = 0
    for spec in instance.running:
        scheduler.restore_running(SeqState.from_spec(spec))
    for spec in (*instance.waiting, target_spec):
        scheduler.add_request(SeqState.from_spec(spec))
    target = scheduler.requests[target_spec.request_id]
    now_s = 0.0
    ttft_s = queueing_s = None
    delay_s = 0.0
    num_steps = 0
    while True:
        while future_spec is not None and future.arrival_s(num_arrived) <= now_s:
            scheduler.add_request(SeqState.from_spec(future_spec._replace(
                request_id=f"{FUTURE_ID_PREFIX}{num_arrived}",
                priority=arrival_ms + request_priority(
                    future.arrival_s(num_arrived), round(future.num_output_tokens),
                    instance.config.priority_ms_per_token))))
            num_arrived += 1
        output = scheduler.schedule()
        duration_s = exec_model.step_ms(output.stats) / 1000.0
        num_new = output.num_scheduled_tokens.get(target.request_id, 0)
        if num_new:
            if queueing_s is None:
                queueing_s = now_s
            others = (len(scheduler.running) + len(scheduler.waiting) - 1
                      - (num_arrived - num_future_finished))
            if others:
                part = BatchStats.of_chunk(num_new, target.num_computed_tokens - num_new,
                                           target.num_tokens)
                extra_ms = (exec_model.step_ms(output.stats)
                            - exec_model.step_ms(output.stats - part))
                delay_s += extra_ms / 1000.0 * others
        result = scheduler.update_from_output(output)
        now_s += duration_s
        num_steps += 1
        if ttft_s is None and target.request_id in result.sampled_ids:
            ttft_s = now_s
        num_future_finished += sum(1 for r in result.finished_ids
                                   if r.startswith(FUTURE_ID_PREFIX))
        if target.request_id in result.finished_ids:
            return WhatIf(ttft_s, now_s, queueing_s, delay_s, num_steps,
                          scheduler.num_preemptions)
