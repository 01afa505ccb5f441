"""The releaser's window of batch requests in flight, steered round by round by what
interactive traffic shows (workers.batch.headroom) and kept in Redis between rounds, and bounded
by the engine slots interactive traffic is expected to leave free."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
from sqlalchemy import select

from domain.batches import BATCH_WINDOW_KEY
from domain.live_fleet import Fleet
from domain.models import InferenceRequest, Priority, RequestStatus, utcnow
from workers.batch.headroom import HeadroomConfig, HeadroomSignal, next_window, slot_bound
from workers.runtime import Runtime

__all__ = ["InteractiveHistory", "batch_window", "current_window", "engine_slots",
           "engines_waiting", "interactive_history", "pool_weights"]

#: A window not renewed for this long is forgotten (the releaser stopped): start again low.
_WINDOW_TTL_S = 600


def batch_window(rt: Runtime) -> int:
    """Batch requests allowed in flight this round: `max_batch_in_flight` when the headroom
    control is off (`batch_headroom_ttft_s` 0), else the window after this round's step, at
    most the live engines' slots less the interactive reserve (`slot_bound`; never below
    `batch_headroom_min_window`)."""
    s = rt.settings
    if s.batch_headroom_ttft_s <= 0:
        return s.max_batch_in_flight
    config = HeadroomConfig(target_ttft_s=s.batch_headroom_ttft_s,
                            min_window=min(s.batch_headroom_min_window, s.max_batch_in_flight),
                            max_window=s.max_batch_in_flight,
                            increase=s.batch_headroom_increase)
    raw = rt.redis.get(BATCH_WINDOW_KEY)
    last = json.loads(raw) if raw else {"window": float(config.min_window), "num_waiting": 0}
    history = interactive_history(rt, s.batch_headroom_window_s)
    signal = HeadroomSignal(ttft_p99_s=history.ttft_p99_s,
                            num_waiting=engines_waiting(rt.fleet),
                            previous_num_waiting=int(last["num_waiting"]))
    window = next_window(float(last["window"]), signal, config)
    bound = None
    num_slots = engine_slots(rt.fleet)
    if s.batch_headroom_slot_margin >= 0 and num_slots:
        bound = slot_bound(num_slots, history.occupancy, s.batch_headroom_slot_margin)
        # NOTE: the window steps from what was allowed: a miss halves what ran.
        window = max(min(window, float(bound)), float(config.min_window))
    rt.redis.set(BATCH_WINDOW_KEY, json.dumps({
        "window": window, "num_waiting": signal.num_waiting, "ttft_p99_s": signal.ttft_p99_s,
        "slot_bound": bound, "interactive_occupancy": history.occupancy}), ex=_WINDOW_TTL_S)
    return int(window)


def current_window(rt: Runtime) -> int:
    """The window the releaser's last round allowed, read without stepping it (a completion
    estimate's): `max_batch_in_flight` when the headroom control is off or no round stored one
    yet (the window grows towards it while interactive traffic allows)."""
    s = rt.settings
    raw = rt.redis.get(BATCH_WINDOW_KEY) if s.batch_headroom_ttft_s > 0 else None
    if not raw:
        return s.max_batch_in_flight
    return max(1, min(int(json.loads(raw)["window"]), s.max_batch_in_flight))


@dataclass(frozen=True, slots=True)
class InteractiveHistory:
    """Interactive requests that finished over the recent window."""

    ttft_p99_s: float | None  # None: none finished
    #: Interactive requests in the engines at once, on average over the window (Little's law:
    #: their seconds from engine start to finish, summed, over the window's seconds).
    occupancy: float


def interactive_history(rt: Runtime, window_s: float) -> InteractiveHistory:
    """TTFT p99 and engine occupancy of the interactive requests that finished in the last
    `window_s` (the first token is written with the completion)."""
    since = utcnow() - timedelta(seconds=window_s)
    with rt.db.session() as session:
        rows = session.execute(
            select(InferenceRequest.created_at, InferenceRequest.first_token_at,
                   InferenceRequest.started_at, InferenceRequest.finished_at)
            .where(InferenceRequest.priority == Priority.INTERACTIVE,
                   InferenceRequest.status == RequestStatus.SUCCEEDED,
                   # NOTE: updated_at (written with the completion) rides the (status,
                   # updated_at) index; finished_at has none.
                   InferenceRequest.updated_at >= since,
                   InferenceRequest.finished_at >= since,
                   InferenceRequest.first_token_at.is_not(None))
        ).all()
    if not rows:
        return InteractiveHistory(None, 0.0)
    ttfts = [(first - created).total_seconds() for created, first, _, _ in rows]
    busy_s = sum((finished - (started or first)).total_seconds()
                 for _, first, started, finished in rows)
    return InteractiveHistory(float(np.percentile(ttfts, 99)), max(busy_s, 0.0) / window_s)


def engine_slots(fleet: Fleet) -> int:
    """Running-batch slots (max_num_seqs) of the live engines that published a state."""
    return sum(status.state.max_num_seqs for status in fleet.statuses()
               if status.alive and status.state is not None)


def pool_weights(fleet: Fleet) -> dict[str, float]:
    """Each model's pool weight for the releaser's fair share (`fair_share.allocate`): the
    seats (max_num_seqs) of its live instances."""
    weights: dict[str, float] = defaultdict(float)
    for status in fleet.statuses():
        if status.alive and status.state is not None:
            weights[status.state.model] += status.state.max_num_seqs
    return dict(weights)


def engines_waiting(fleet: Fleet) -> int:
    """Requests waiting in the live engines' queues (admitted by a worker, not scheduled):
    any wait there means the fleet has no room to spare."""
    return sum(status.state.num_waiting for status in fleet.statuses()
               if status.alive and status.state is not None)
