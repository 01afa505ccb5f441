"""batch API parity (output expiry, partial output on cancel)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 12:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # OpenAI's `output_expires_after.seconds`: the output and error files expire this long
    # after they are written.
    op.add_column("batches", sa.Column("output_expires_after_s", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("batches", "output_expires_after_s")
