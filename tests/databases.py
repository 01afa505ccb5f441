"""The test database: a template migrated once per test process, and a fresh database per test.

The first test of a process gets a copy of the template (CREATE DATABASE ... TEMPLATE, a few
hundred milliseconds: PostgreSQL writes every page of the new database through its WAL). Each
later test gets the same state back in one short transaction instead (`TemplateState.restore`):
the connections the previous test left are closed, as DROP DATABASE ... WITH (FORCE) did, every
table is emptied, the template's rows (alembic's version) put back and each sequence set where
the template has it. A database whose tables are not the template's any more is copied again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

__all__ = ["TemplateState", "copy_of_template", "drop_database", "template_url"]


def template_url(url: str) -> str:
    """The template beside the test database of `url`: `<database>_template`."""
    parsed = make_url(url)
    return parsed.set(database=f"{parsed.database}_template").render_as_string(hide_password=False)


def _admin_engine(url: str) -> sa.Engine:
    return sa.create_engine(make_url(url).set(database="postgres"), isolation_level="AUTOCOMMIT",
                            poolclass=NullPool)


def drop_database(url: str) -> None:
    with _admin_engine(url).connect() as connection:
        connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" '
                                   "WITH (FORCE)"))


def copy_of_template(template: str, url: str) -> None:
    """Drop the database of `url` (closing its connections) and create it again as a copy of
    the migrated template."""
    with _admin_engine(url).connect() as connection:
        name, source = make_url(url).database, make_url(template).database
        connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        connection.execute(sa.text(f'CREATE DATABASE "{name}" TEMPLATE "{source}"'))


_CLOSE_OTHER_CONNECTIONS = sa.text(
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()")


@dataclass(frozen=True)
class TemplateState:
    """What a fresh copy of the template holds: its tables (children before parents), their
    rows, and each sequence's position."""

    tables: tuple[sa.Table, ...]
    rows: dict[str, list[dict[str, Any]]]
    sequences: dict[str, tuple[int, bool]]

    @classmethod
    def read(cls, template: str) -> TemplateState:
        engine = sa.create_engine(template, poolclass=NullPool)
        try:
            with engine.connect() as connection:
                metadata = sa.MetaData()
                metadata.reflect(connection)
                tables = tuple(reversed(metadata.sorted_tables))
                rows = {table.name: [dict(row) for row in
                                     connection.execute(table.select()).mappings()]
                        for table in tables}
                names = connection.scalars(sa.text(
                    "SELECT sequencename FROM pg_sequences WHERE schemaname = 'public'")).all()
                sequences = {name: tuple(connection.execute(sa.text(
                    f'SELECT last_value, is_called FROM "{name}"')).one()) for name in names}
        finally:
            engine.dispose()
        return cls(tables, {name: found for name, found in rows.items() if found}, sequences)

    @property
    def _empty_sql(self) -> str:
        """Every table emptied (children first) and every sequence set back."""
        deletes = [f'DELETE FROM "{table.name}"' for table in self.tables]
        setvals = [f"SELECT setval('\"{name}\"', {value}, {str(is_called).lower()})"
                   for name, (value, is_called) in self.sequences.items()]
        return "; ".join(deletes + setvals)

    def restore(self, url: str) -> bool:
        """Puts the database of `url` back in the template's state; False (nothing done) when
        its tables are not the template's (a copy is needed)."""
        engine = sa.create_engine(url, poolclass=NullPool)
        try:
            with engine.begin() as connection:
                connection.execute(_CLOSE_OTHER_CONNECTIONS)
                present = set(connection.scalars(sa.text(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")))
                if present != {table.name for table in self.tables}:
                    return False
                connection.exec_driver_sql(self._empty_sql)  # one round trip
                for table in reversed(self.tables):
                    if table.name in self.rows:
                        connection.execute(table.insert(), self.rows[table.name])
        except sa.exc.OperationalError:
            return False  # no such database (yet): a copy makes it
        finally:
            engine.dispose()
        return True
