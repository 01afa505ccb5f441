"""Alembic is the only schema path: it upgrades, downgrades and matches the models."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from domain.migrate import alembic_config, downgrade, recreate_database, upgrade
from tests.environment import TEST_DATABASE_URL

pytestmark = pytest.mark.services

#: A database of its own beside the test database (so concurrent runs with their own
#: BLOCKQ_TEST_DATABASE_URL do not collide here either).
_test_url = sa.engine.make_url(TEST_DATABASE_URL)
MIGRATIONS_DB = _test_url.set(database=f"{_test_url.database}_migrations").render_as_string(
    hide_password=False)


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
        "files",
        "batches",
        "batch_lines",
        "outbox",
        "operator_controls",
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


def test_upgrade_downgrade_upgrade_on_sqlite(tmp_path: Path) -> None:
    """The embedded demo database takes every revision too (batch mode for table changes)."""
    url = f"sqlite:///{tmp_path / 'blockq.sqlite3'}"
    upgrade(url)
    command.check(alembic_config(url))
    downgrade(url, "base")
    assert _tables(url) == {"alembic_version"}
    upgrade(url)
    assert {"requests", "files", "batches", "batch_lines"} <= _tables(url)


def _batch_line_shape(url: str) -> tuple[set[str], set[str]]:
    engine = sa.create_engine(url)
    try:
        inspector = sa.inspect(engine)
        return ({c["name"] for c in inspector.get_columns("batch_lines")},
                {i["name"] for i in inspector.get_indexes("batch_lines")})
    finally:
        engine.dispose()


def test_prefix_groups_upgrade_and_downgrade_on_postgresql() -> None:
    """0015 adds batch_lines.prefix_group and moves the releaser's index onto it; its downgrade
    gives back the file-order index."""
    recreate_database(MIGRATIONS_DB)
    upgrade(MIGRATIONS_DB)
    columns, indexes = _batch_line_shape(MIGRATIONS_DB)
    assert "prefix_group" in columns
    assert "ix_batch_lines_batch_id_status_prefix_group" in indexes
    assert "ix_batch_lines_batch_id_status" not in indexes
    downgrade(MIGRATIONS_DB, "0014")
    columns, indexes = _batch_line_shape(MIGRATIONS_DB)
    assert "prefix_group" not in columns
    assert indexes >= {"ix_batch_lines_batch_id_status"}
    assert "ix_batch_lines_batch_id_status_prefix_group" not in indexes
    upgrade(MIGRATIONS_DB)
    assert "prefix_group" in _batch_line_shape(MIGRATIONS_DB)[0]
