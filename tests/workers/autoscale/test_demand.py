"""What the autoscaler reads of batches, on the real PostgreSQL and Redis: a running batch
whose completion estimate falls after its window asks for the lines a second it lacks."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest
import redis

from domain import batches
from domain.batches import BATCH_ETA_KEY
from domain.db import Database
from domain.models import Batch, BatchStatus
from domain.settings import Settings
from domain.teams import create_team
from workers.autoscale.demand import late_batch_rps

pytestmark = pytest.mark.services


def _batch(db: Database, client: redis.Redis, *, model: str | None, time_left_s: float,
           meets: bool, remaining: int, lines_per_s: float | None,
           status: BatchStatus = BatchStatus.IN_PROGRESS) -> str:
    now = time.time()
    with db.session() as session:
        team = create_team(session, f"team-{batches.new_batch_id()[-8:]}")
        batch = Batch(id=batches.new_batch_id(), team_id=team.id, endpoint="/v1/completions",
                      input_file_id="file-x", completion_window="24h", model=model,
                      status=status,
                      expires_at=datetime.fromtimestamp(now + time_left_s, UTC))
        session.add(batch)
    client.hset(BATCH_ETA_KEY, batch.id, json.dumps({
        "estimated_completion_at": int(now + 10 * time_left_s), "estimated_at": int(now),
        "meets_completion_window": meets, "remaining_lines": remaining,
        "lines_per_s": lines_per_s}))
    return batch.id


def test_late_batches_ask_for_the_lines_a_second_they_lack(fresh_services: Settings) -> None:
    db = Database(fresh_services.resolved_database_url)
    client = redis.Redis.from_url(fresh_services.redis_url)
    try:
        # 1,000 lines in 100 s need 10 a second; the estimate gives 4: 6 lacking.
        _batch(db, client, model="chat", time_left_s=100, meets=False, remaining=1000,
               lines_per_s=4.0)
        # A second late one of the same model adds its own shortfall: 300 / 100 - 1 = 2.
        _batch(db, client, model="chat", time_left_s=100, meets=False, remaining=300,
               lines_per_s=1.0)
        # The default model's (a batch that names none), with no rate at all (capped).
        _batch(db, client, model=None, time_left_s=200, meets=False, remaining=400,
               lines_per_s=None)
        # In time, past its window, or not running: they ask for nothing.
        _batch(db, client, model="code", time_left_s=100, meets=True, remaining=5000,
               lines_per_s=1.0)
        _batch(db, client, model="code", time_left_s=-5, meets=False, remaining=5000,
               lines_per_s=1.0)
        _batch(db, client, model="code", time_left_s=100, meets=False, remaining=5000,
               lines_per_s=1.0, status=BatchStatus.CANCELLING)

        lacking = late_batch_rps(db, client, time.time(), default_model="base")

        assert lacking.keys() == {"chat", "base"}
        assert lacking["chat"] == pytest.approx(8.0, rel=0.02)
        assert lacking["base"] == pytest.approx(2.0, rel=0.02)
    finally:
        db.dispose()
        client.close()
