"""The connection pool on PostgreSQL (domain/db.py): pooled connections are reused without a ping,
and one whose server ended it is replaced before use, never handed to a caller."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from domain.db import Database
from domain.settings import Settings

pytestmark = pytest.mark.services


def _backend_pid(db: Database) -> int:
    with db.session() as session:
        return int(session.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())


def test_a_healthy_pooled_connection_is_reused_without_a_ping(fresh_services: Settings) -> None:
    db = Database(fresh_services.resolved_database_url)
    try:
        assert db.engine.pool._pre_ping is False  # noqa: SLF001 - no SELECT 1 per checkout
        first = _backend_pid(db)
        assert all(_backend_pid(db) == first for _ in range(5))
    finally:
        db.dispose()


def test_a_connection_the_server_ended_is_replaced_before_use(fresh_services: Settings) -> None:
    db = Database(fresh_services.resolved_database_url)
    admin = sa.create_engine(fresh_services.resolved_database_url)
    try:
        victim = _backend_pid(db)  # now idle in the pool
        with admin.begin() as conn:
            assert conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"),
                                {"pid": victim}).scalar_one()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until the backend has gone
            with admin.connect() as conn:
                if not conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity "
                                            "WHERE pid = :pid"), {"pid": victim}).scalar_one():
                    break
            time.sleep(0.05)
        # The next transaction gets a new connection instead of an error.
        assert _backend_pid(db) != victim
    finally:
        db.dispose()
        admin.dispose()
