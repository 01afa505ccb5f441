"""per-request latency targets, their outcome, and each team's action on a miss

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 22:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A request's optional targets (milliseconds from acceptance), the team's action in force
    # when it was accepted, and whether it met each target once finished (domain/slo.py).
    op.add_column("requests", sa.Column("slo_ttft_ms", sa.REAL(), nullable=True))
    op.add_column("requests", sa.Column("slo_e2e_ms", sa.REAL(), nullable=True))
    op.add_column("requests", sa.Column("slo_miss_action", sa.String(length=8), nullable=True))
    op.add_column("requests", sa.Column("slo_ttft_met", sa.Boolean(), nullable=True))
    op.add_column("requests", sa.Column("slo_e2e_met", sa.Boolean(), nullable=True))
    # route (the default): a request no instance can meet is routed anyway.
    op.add_column("teams", sa.Column("slo_miss_action", sa.String(length=8), nullable=False,
                                     server_default="route"))


def downgrade() -> None:
    op.drop_column("teams", "slo_miss_action")
    for name in ("slo_e2e_met", "slo_ttft_met", "slo_miss_action", "slo_e2e_ms", "slo_ttft_ms"):
        op.drop_column("requests", name)
