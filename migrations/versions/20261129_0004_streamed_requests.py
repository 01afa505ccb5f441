"""streamed requests

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 21:44:19.059855
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "requests",
        sa.Column("stream", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("stream")
