"""teams and api keys

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 21:40:50.681733
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("share", sa.Integer(), nullable=False),
        sa.Column("rate_limit_rpm", sa.Integer(), nullable=True),
        sa.Column("webhook_url", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_teams")),
        sa.UniqueConstraint("name", name=op.f("uq_teams_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("team_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("key_sha256", sa.String(length=64), nullable=False),
        sa.Column("key_prefix", sa.String(length=16), nullable=False),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_api_keys_team_id_teams"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_sha256", name=op.f("uq_api_keys_key_sha256")),
    )
    # NOTE: batch mode, so that SQLite (the embedded demo database) can add the foreign key.
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("team_id", sa.String(length=40), nullable=True))
        batch.create_index("ix_requests_team_id_created_at", ["team_id", "created_at"])
        batch.create_foreign_key(op.f("fk_requests_team_id_teams"), "teams", ["team_id"], ["id"])


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_constraint(op.f("fk_requests_team_id_teams"), type_="foreignkey")
        batch.drop_index("ix_requests_team_id_created_at")
        batch.drop_column("team_id")
    op.drop_table("api_keys")
    op.drop_table("teams")
