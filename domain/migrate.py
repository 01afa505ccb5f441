"""Apply Alembic migrations from code (the CLI and tests); Alembic stays the only schema path."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import make_url

__all__ = ["alembic_config", "upgrade", "downgrade", "recreate_database"]

_ROOT = Path(__file__).resolve().parent.parent


def alembic_config(database_url: str) -> Config:
    config = Config(str(_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(_ROOT / "migrations"))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(database_url), revision)


def recreate_database(url: str) -> None:
    """Drop and create the PostgreSQL database named in `url` (tests and benchmarks only),
    connecting to the server's `postgres` database to do it."""
    parsed = make_url(url)
    admin = sa.create_engine(parsed.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{parsed.database}" WITH (FORCE)'))
        conn.execute(sa.text(f'CREATE DATABASE "{parsed.database}"'))
    admin.dispose()
