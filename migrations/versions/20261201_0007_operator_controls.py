"""operator controls (holds, routing-policy override) kept in the database

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 10:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "operator_controls",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("value", sa.String(length=64), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_operator_controls")),
    )


def downgrade() -> None:
    op.drop_table("operator_controls")
