"""What the transactional outbox costs one hand-off between stages, on PostgreSQL and Redis.

Each hand-off changes one request row and sends one task message, as a stage does:
- `direct`: the row committed, then the message sent (the pipeline before the outbox: a crash
  or a broker outage between the two lost the message);
- `outbox`: the row and an outbox entry committed together, the message sent, the entry deleted
  (domain/outbox.py).
The two kinds alternate, so that whatever else the machine does falls on both alike.

    .venv/bin/python scripts/bench_outbox.py --handoffs 1000
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import redis
from rich.console import Console
from rich.table import Table
from sqlalchemy import update
from sqlalchemy.orm import Session

from benchmarks import quiet
from domain import dispatch, request_store
from domain.celery_app import create_celery
from domain.db import Database
from domain.migrate import recreate_database, upgrade
from domain.models import InferenceRequest, Priority, utcnow
from domain.outbox import Outbox
from domain.settings import Settings

DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/blockq_bench_outbox"
REDIS_URL = "redis://127.0.0.1:6379/11"


def _request(db: Database) -> str:
    fields = {"priority": Priority.INTERACTIVE, "prompt": "Hello", "messages": None,
              "max_tokens": 16, "temperature": 1.0, "top_p": 1.0, "seed": None, "stop": None,
              "webhook_url": None, "stream": False, "request_metadata": None,
              "body_sha256": "0" * 64, "prompt_tokens": 3}
    with db.session() as session:
        request, _ = request_store.create_request(session, fields, idempotency_key=None)
        return request.id


def _touch(session: Session, request_id: str) -> None:
    session.execute(update(InferenceRequest).where(InferenceRequest.id == request_id)
                    .values(updated_at=utcnow()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handoffs", type=int, default=1000, help="of each kind")
    args = parser.parse_args()
    with quiet.alone():  # measured alone, on a quiet machine
        recreate_database(DATABASE_URL)
        upgrade(DATABASE_URL)
        broker = redis.Redis.from_url(REDIS_URL)
        broker.flushdb()
        settings = Settings(database_url=DATABASE_URL, redis_url=REDIS_URL)
        db = Database(DATABASE_URL)
        celery = create_celery(settings, set_as_current=False)
        outbox = Outbox(db, celery)
        request_id = _request(db)
        message = dispatch.predict(request_id, priority=0)

        def direct() -> None:
            with db.session() as session:
                _touch(session, request_id)
            message.send(celery)

        def staged() -> None:
            with outbox.transaction() as tx:
                _touch(tx.session, request_id)
                tx.post(message)

        kinds: dict[str, Callable[[], None]] = {"direct": direct, "outbox": staged}
        timings: dict[str, list[float]] = {name: [] for name in kinds}
        for handoff in kinds.values():  # warm the pools
            for _ in range(20):
                handoff()
        for _ in range(args.handoffs):
            for name, handoff in kinds.items():
                started = time.perf_counter()
                handoff()
                timings[name].append((time.perf_counter() - started) * 1000)
        broker.flushdb()
        db.dispose()
        _report(timings, args.handoffs)
        return 0


def _report(timings: dict[str, list[float]], handoffs: int) -> None:
    table = Table(title=f"one hand-off (row change + task message), {handoffs} of each, ms")
    for column in ("kind", "p50", "p90", "p99", "mean"):
        table.add_column(column, justify="right" if column != "kind" else "left")
    for name, values in timings.items():
        cuts = statistics.quantiles(values, n=100)
        table.add_row(name, f"{cuts[49]:.2f}", f"{cuts[89]:.2f}", f"{cuts[98]:.2f}",
                      f"{statistics.fmean(values):.2f}")
    Console().print(table)
    extra = statistics.median(timings["outbox"]) - statistics.median(timings["direct"])
    Console().print(f"the outbox adds {extra:.2f} ms (median) to each hand-off; a request "
                    "makes three (predict, route, generate) and one more per webhook")
