"""per-team webhook signing secrets; refused webhook deliveries are final

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 12:30:00
"""

import base64
import secrets
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    table = op.create_table(
        "team_webhook_secrets",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("team_id", sa.String(length=40), nullable=False),
        sa.Column("secret", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"],
                                name=op.f("fk_team_webhook_secrets_team_id_teams"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_team_webhook_secrets")),
    )
    op.create_index("ix_team_webhook_secrets_team_id", "team_webhook_secrets", ["team_id"])
    with op.batch_alter_table("webhook_deliveries") as batch:
        batch.add_column(sa.Column("permanent", sa.Boolean(), server_default=sa.false(),
                                   nullable=False))
    # Every existing team gets a secret of its own (they shared the global one before);
    # `blockq teams rotate-webhook-secret` hands it to the team.
    team_ids = op.get_bind().execute(sa.text("SELECT id FROM teams")).scalars().all()
    now = datetime.now(UTC)
    op.bulk_insert(table, [
        {"id": f"whs_{uuid.uuid4().hex[:24]}", "team_id": team_id, "created_at": now,
         "secret": "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()}
        for team_id in team_ids
    ])


def downgrade() -> None:
    with op.batch_alter_table("webhook_deliveries") as batch:
        batch.drop_column("permanent")
    op.drop_index("ix_team_webhook_secrets_team_id", table_name="team_webhook_secrets")
    op.drop_table("team_webhook_secrets")
