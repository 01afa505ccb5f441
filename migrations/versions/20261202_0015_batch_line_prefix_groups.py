"""a batch line's prefix group, for releasing lines that share a prompt prefix together

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02 09:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The number of the batch's first line whose prompt opens with the same tokens
    # (workers/batch/prefix_groups.py); the releaser claims by (prefix_group, line). Lines
    # expanded before keep NULL: every line of their batch does, so they go in file order.
    op.add_column("batch_lines", sa.Column("prefix_group", sa.Integer(), nullable=True))
    # The releaser's order replaces file order in its index (counts by status still use it).
    op.create_index("ix_batch_lines_batch_id_status_prefix_group", "batch_lines",
                    ["batch_id", "status", "prefix_group", "line"])
    op.drop_index("ix_batch_lines_batch_id_status", table_name="batch_lines")


def downgrade() -> None:
    op.create_index("ix_batch_lines_batch_id_status", "batch_lines",
                    ["batch_id", "status", "line"])
    op.drop_index("ix_batch_lines_batch_id_status_prefix_group", table_name="batch_lines")
    op.drop_column("batch_lines", "prefix_group")
