"""several models on one fleet: each request's model, and every model ever served

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 03:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The model a request asked for; rows from before keep NULL (the default model's).
    op.add_column("requests", sa.Column("model", sa.String(length=255), nullable=True))
    # Every model an instance has declared: a request for one of them waits out an outage of
    # its instances (a held call gets 503), one for any other model gets 404.
    op.create_table(
        "served_models",
        sa.Column("name", sa.String(length=255), primary_key=True),
        sa.Column("model_path", sa.Text(), nullable=False),
        sa.Column("first_declared_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_declared_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("served_models")
    op.drop_column("requests", "model")
