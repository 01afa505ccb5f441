"""a change to any key or team notifies the API processes' key caches (domain/principal_cache.py)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 15:10:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The channel domain/principal_cache.py listens on.
CHANNEL = "blockq_auth"
TABLES = ("api_keys", "teams")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return  # no listener there: the API looks every key up
    # NOTE: statement-level, from every writer (the CLI, the admin API, hand-written SQL): the
    # notification is delivered at the commit of the change, and only then.
    op.execute(f"""
        CREATE FUNCTION blockq_auth_changed() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('{CHANNEL}', TG_TABLE_NAME);
            RETURN NULL;
        END
        $$
    """)
    for table in TABLES:
        op.execute(f"""
            CREATE TRIGGER {table}_auth_changed AFTER UPDATE OR DELETE OR TRUNCATE ON {table}
            FOR EACH STATEMENT EXECUTE FUNCTION blockq_auth_changed()
        """)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        op.execute(f"DROP TRIGGER {table}_auth_changed ON {table}")
    op.execute("DROP FUNCTION blockq_auth_changed()")
