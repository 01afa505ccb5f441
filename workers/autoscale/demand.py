"""What the autoscaler reads and moves: the request history it sizes from (PostgreSQL), the
requests waiting for a model at zero, the batches estimated to finish after their completion
windows, and a draining instance's waiting requests, which go back to routing."""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import UTC, datetime

import redis
from sqlalchemy import func, select

from domain import dispatch, request_store
from domain.batches import batch_estimates
from domain.db import Database
from domain.live_fleet import InstanceStatus
from domain.models import Batch, BatchStatus, InferenceRequest, Priority, RequestStatus
from domain.outbox import Outbox
from workers.autoscale.decide import Arrival

__all__ = ["late_batch_rps", "recent_arrivals", "requeue_waiting", "waiting_by_model"]

logger = logging.getLogger(__name__)

#: Requests not routed yet: what a model at zero has waiting.
UNROUTED = (RequestStatus.QUEUED, RequestStatus.PREDICTING)


def recent_arrivals(db: Database, since_s: float, default_model: str
                    ) -> dict[str, list[Arrival]]:
    """Model -> its requests created since `since_s` (Unix time), oldest first: arrival, prompt
    tokens, and the output tokens (the real count once finished, else the predicted one, else
    max_tokens)."""
    since = datetime.fromtimestamp(since_s, UTC)
    query = (select(InferenceRequest.model, InferenceRequest.created_at,
                    InferenceRequest.prompt_tokens, InferenceRequest.output_tokens,
                    InferenceRequest.predicted_output_tokens, InferenceRequest.max_tokens)
             .where(InferenceRequest.created_at >= since)
             .order_by(InferenceRequest.created_at))
    by_model: dict[str, list[Arrival]] = defaultdict(list)
    with db.session() as session:
        for model, created_at, prompt, output, predicted, max_tokens in session.execute(query):
            by_model[model or default_model].append(Arrival(
                created_at.timestamp(), max(1, prompt), max(1, output or predicted or max_tokens)))
    return dict(by_model)


def waiting_by_model(db: Database) -> dict[str, int]:
    """Model -> requests accepted and not routed yet."""
    query = (select(InferenceRequest.model, func.count())
             .where(InferenceRequest.status.in_(UNROUTED))
             .group_by(InferenceRequest.model))
    with db.session() as session:
        return {model: int(count) for model, count in session.execute(query) if model}


def late_batch_rps(db: Database, client: redis.Redis, now_s: float,
                   default_model: str) -> dict[str, float]:
    """Model -> the lines a second its running batches lack: for each batch whose latest
    completion estimate falls after its completion window, the lines it has left over the time
    left, less the lines a second the estimate gives it. A batch past its window already asks
    for nothing (it expires)."""
    with db.session() as session:
        running = session.execute(select(Batch.id, Batch.model, Batch.expires_at)
                                  .where(Batch.status == BatchStatus.IN_PROGRESS)).all()
    estimates = batch_estimates(client, [batch_id for batch_id, _, _ in running])
    lacking: dict[str, float] = defaultdict(float)
    for batch_id, model, expires_at in running:
        estimate = estimates.get(batch_id)
        time_left_s = expires_at.timestamp() - now_s
        if estimate is None or estimate["meets_completion_window"] or time_left_s <= 0:
            continue
        needed = estimate["remaining_lines"] / time_left_s
        lacking[model or default_model] += max(0.0, needed - (estimate["lines_per_s"] or 0.0))
    return {model: rps for model, rps in lacking.items() if rps > 0}


def requeue_waiting(outbox: Outbox, status: InstanceStatus) -> int:
    """Send the requests waiting unstarted in a draining instance's engine back to routing:
    not streamed (a stream's client may hold its first bytes) and not started (no first token,
    waiting as the engine last published). The same fence as every re-route: the old engine
    aborts the request at its next ownership check, the attempt check refuses what it writes."""
    if status.state is None:
        return 0
    waiting = [r.request_id for r in status.state.requests
               if not r.is_running and r.num_computed_tokens == 0 and r.num_output_tokens == 0]
    moved = 0
    for request_id in waiting:
        with outbox.transaction() as tx:
            row = request_store.transition_returning(
                tx.session, request_id, RequestStatus.QUEUED,
                allowed_from=(RequestStatus.ROUTED, RequestStatus.RUNNING),
                extra_where=[InferenceRequest.instance_id == status.instance_id,
                             InferenceRequest.stream.is_(False),
                             InferenceRequest.first_token_at.is_(None)],
                detail=f"requeued: {status.instance_id} is draining (scale-down)",
                returning=(InferenceRequest.priority,),
            )
            if row is not None:
                tx.post(dispatch.route(request_id, priority=Priority(row.priority).rank))
                moved += 1
    if moved:
        logger.info("drain of %s: %d waiting requests back to routing", status.instance_id,
                    moved)
    return moved
