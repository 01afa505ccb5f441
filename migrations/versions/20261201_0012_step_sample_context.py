"""step samples' context features

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 19:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("decode_context_tokens", "prefill_chunk_x_context", "prefill_chunk_sq")


def upgrade() -> None:
    # The execution-time model's context features of each engine step (tokens attended by
    # decodes; prefill chunk x tokens computed before it; chunk squared), so that refits from
    # recorded steps can price long contexts. Rows recorded before read 0 (no context known).
    for name in COLUMNS:
        op.add_column("engine_step_samples",
                      sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    for name in reversed(COLUMNS):
        op.drop_column("engine_step_samples", name)
