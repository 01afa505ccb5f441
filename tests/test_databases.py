"""Each test's fresh database (tests/databases.py): emptied in place, it is the template's state
again, whatever the previous test left."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from domain.models import OutboxEntry
from domain.settings import Settings
from domain.teams import ensure_team_key
from tests.databases import TemplateState


def _counts(connection: sa.Connection, tables: list[str]) -> dict[str, int]:
    return {name: connection.scalar(sa.text(f'SELECT count(*) FROM "{name}"')) or 0
            for name in tables}


def test_a_restored_database_is_the_templates_state_again(
    fresh_services: Settings, migrated_template: str
) -> None:
    state = TemplateState.read(migrated_template)
    url = fresh_services.database_url
    engine = sa.create_engine(url)
    tables = [table.name for table in state.tables]
    with engine.connect() as connection:
        fresh_counts = _counts(connection, tables)
        version = connection.scalar(sa.text("SELECT version_num FROM alembic_version"))
    assert fresh_counts["alembic_version"] == 1 and sum(fresh_counts.values()) == 1
    assert state.sequences and all(not called for _, called in state.sequences.values())

    # What a test leaves: rows in parent and child tables, sequences moved on, and a connection
    # idle in a transaction holding locks on a row.
    with Session(engine) as session, session.begin():
        team = ensure_team_key(session, "left-behind").team_id  # a team and its key
        session.add(_outbox_entry())
    leftover = engine.connect()
    leftover.execute(sa.text("UPDATE teams SET name = 'held' WHERE id = :id"), {"id": team})

    assert state.restore(url)
    assert leftover.closed or leftover.invalidated or _is_gone(leftover)
    with engine.connect() as connection:
        assert _counts(connection, tables) == fresh_counts
        assert connection.scalar(sa.text("SELECT version_num FROM alembic_version")) == version
    with Session(engine) as session, session.begin():
        entry = _outbox_entry()
        session.add(entry)
        session.flush()
        assert entry.id == 1  # the sequence starts again

    with engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE outbox"))
    engine.dispose()
    assert not state.restore(url)  # a schema not the template's: the caller copies again


def _outbox_entry() -> OutboxEntry:
    return OutboxEntry(task="t", queue="q", args=[], kwargs={}, priority=0)


def _is_gone(connection: sa.Connection) -> bool:
    """The server closed this connection (restore ends every other connection)."""
    try:
        connection.execute(sa.text("SELECT 1"))
    except sa.exc.DBAPIError:
        return True
    return False
