"""Alembic environment: the URL comes from Settings (or the caller's Config), metadata from
domain.models."""

from alembic import context
from sqlalchemy import create_engine

from domain.models import Base
from domain.settings import Settings

config = context.config
url = config.get_main_option("sqlalchemy.url") or Settings.load().resolved_database_url


def run_migrations_offline() -> None:
    context.configure(url=url, target_metadata=Base.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection") or create_engine(url, hide_parameters=True)
    if hasattr(connectable, "connect") and not hasattr(connectable, "execute"):
        with connectable.connect() as connection:
            _run(connection)
    else:
        _run(connectable)


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
