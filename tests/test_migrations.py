"""Alembic is the only schema path: it upgrades, downgrades and matches the models."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic import command

from app.migrate import alembic_config, downgrade, recreate_database, upgrade

pytestmark = pytest.mark.services

MIGRATIONS_DB = "postgresql+psycopg://postgres@127.0.0.1:5432/blockq_migrations_test"


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade_on_postgresql() -> None:
    recreate_database(MIGRATIONS_DB)
    upgrade(MIGRATIONS_DB)
    expected = {
        "requests",
        "request_events",
        "instances",
        "engine_step_samples",
        "webhook_deliveries",
        "alembic_version",
    }
    assert expected <= _tables(MIGRATIONS_DB)
    downgrade(MIGRATIONS_DB, "base")
    assert _tables(MIGRATIONS_DB) == {"alembic_version"}
    upgrade(MIGRATIONS_DB)
    assert expected <= _tables(MIGRATIONS_DB)


def test_models_match_migrations() -> None:
    recreate_database(MIGRATIONS_DB)
    upgrade(MIGRATIONS_DB)
    command.check(alembic_config(MIGRATIONS_DB))  # raises when the models drifted
