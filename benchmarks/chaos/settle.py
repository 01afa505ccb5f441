"""Settling: waiting after the faults until every request and batch is terminal and every
webhook delivered."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import func, select

from benchmarks.chaos.receiver import WebhookReceiver
from benchmarks.chaos.terminal import TERMINAL, TERMINAL_BATCH
from domain.db import Database
from domain.models import Batch, InferenceRequest, Team
from workers.webhooks.events import event_id


def _unfinished(db: Database) -> tuple[int, int]:
    """(requests not terminal, batches not terminal)."""
    with db.session() as session:
        requests = session.scalar(select(func.count()).select_from(InferenceRequest)
                                  .where(InferenceRequest.status.not_in(TERMINAL))) or 0
        batches = session.scalar(select(func.count()).select_from(Batch)
                                 .where(Batch.status.not_in(TERMINAL_BATCH))) or 0
    return requests, batches


def _webhooks_pending(db: Database, receiver: WebhookReceiver) -> int:
    """Events of terminal requests and batches not delivered yet (every batch team of the run
    has a webhook URL)."""
    delivered = {d.webhook_id for d in receiver.snapshot() if d.answered < 300}
    with db.session() as session:
        wanted = [event_id(rid, f"request.{status}") for rid, status in session.execute(
            select(InferenceRequest.id, InferenceRequest.status)
            .where(InferenceRequest.webhook_url.is_not(None),
                   InferenceRequest.status.in_(TERMINAL)))]
        wanted += [event_id(bid, f"batch.{status}") for bid, status in session.execute(
            select(Batch.id, Batch.status).join(Team, Team.id == Batch.team_id)
            .where(Team.webhook_url.is_not(None), Batch.status.in_(TERMINAL_BATCH)))]
    return sum(1 for w in wanted if w not in delivered)


def settle(db: Database, receiver: WebhookReceiver, timeout_s: float) -> dict[str, Any]:
    """Waits until every request and batch is terminal and every webhook delivered, or the
    timeout; what was left."""
    started = time.monotonic()
    left: tuple[int, int, int] = (-1, -1, -1)
    while time.monotonic() - started < timeout_s:
        try:
            requests, batches = _unfinished(db)
            left = (requests, batches, _webhooks_pending(db, receiver))
        except Exception:  # noqa: BLE001 - the database may still be coming back
            time.sleep(1)
            continue
        if left == (0, 0, 0):
            break
        time.sleep(1)
    return {"seconds": round(time.monotonic() - started, 1), "settled": left == (0, 0, 0),
            "requests_unfinished": left[0], "batches_unfinished": left[1],
            "webhooks_pending": left[2]}
