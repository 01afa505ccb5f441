"""The releaser's window of batch requests in flight, steered round by round by what
interactive traffic shows (workers.batch.headroom) and kept in Redis between rounds."""

from __future__ import annotations

import json
from datetime import timedelta

import numpy as np
from sqlalchemy import select

from app.batches import BATCH_WINDOW_KEY
from app.fleet import Fleet
from app.models import InferenceRequest, Priority, RequestStatus, utcnow
from workers.batch.headroom import HeadroomConfig, HeadroomSignal, next_window
from workers.runtime import Runtime

__all__ = ["batch_window", "engines_waiting", "interactive_ttft_p99_s"]

#: A window not renewed for this long is forgotten (the releaser stopped): start again low.
_WINDOW_TTL_S = 600


def batch_window(rt: Runtime) -> int:
    """Batch requests allowed in flight this round: `max_batch_in_flight` when the headroom
    control is off (`batch_headroom_ttft_s` 0), else the window after this round's step."""
    s = rt.settings
    if s.batch_headroom_ttft_s <= 0:
        return s.max_batch_in_flight
    config = HeadroomConfig(target_ttft_s=s.batch_headroom_ttft_s,
                            min_window=min(s.batch_headroom_min_window, s.max_batch_in_flight),
                            max_window=s.max_batch_in_flight,
                            increase=s.batch_headroom_increase)
    raw = rt.redis.get(BATCH_WINDOW_KEY)
    last = json.loads(raw) if raw else {"window": float(config.min_window), "num_waiting": 0}
    signal = HeadroomSignal(ttft_p99_s=interactive_ttft_p99_s(rt, s.batch_headroom_window_s),
                            num_waiting=engines_waiting(rt.fleet),
                            previous_num_waiting=int(last["num_waiting"]))
    window = next_window(float(last["window"]), signal, config)
    rt.redis.set(BATCH_WINDOW_KEY, json.dumps({"window": window, "num_waiting": signal.num_waiting,
                                         "ttft_p99_s": signal.ttft_p99_s}), ex=_WINDOW_TTL_S)
    return int(window)


def interactive_ttft_p99_s(rt: Runtime, window_s: float) -> float | None:
    """TTFT p99 of the interactive requests that finished in the last `window_s` (the first
    token is written with the completion); None when none did."""
    since = utcnow() - timedelta(seconds=window_s)
    with rt.db.session() as session:
        rows = session.execute(
            select(InferenceRequest.created_at, InferenceRequest.first_token_at)
            .where(InferenceRequest.priority == Priority.INTERACTIVE,
                   InferenceRequest.status == RequestStatus.SUCCEEDED,
                   # NOTE: updated_at (written with the completion) rides the (status,
                   # updated_at) index; finished_at has none.
                   InferenceRequest.updated_at >= since,
                   InferenceRequest.finished_at >= since,
                   InferenceRequest.first_token_at.is_not(None))
        ).all()
    if not rows:
        return None
    ttfts = [(first - created).total_seconds() for created, first in rows]
    return float(np.percentile(ttfts, 99))


def engines_waiting(fleet: Fleet) -> int:
    """Requests waiting in the live engines' queues (admitted by a worker, not scheduled):
    any wait there means the fleet has no room to spare."""
    return sum(status.state.num_waiting for status in fleet.statuses()
               if status.alive and status.state is not None)
