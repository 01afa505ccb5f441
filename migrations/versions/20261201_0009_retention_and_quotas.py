"""retention, file expiry and storage quotas

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 12:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("files", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_files_expires_at", "files", ["expires_at"])
    op.add_column("teams", sa.Column("storage_quota_bytes", sa.BigInteger(), nullable=True))
    # The retention purge finds old rows by time: one index per table it purges by age.
    op.create_index("ix_request_outcomes_finished_at", "request_outcomes", ["finished_at"])
    op.create_index("ix_engine_step_samples_at", "engine_step_samples", ["at"])
    op.create_index("ix_webhook_deliveries_at", "webhook_deliveries", ["at"])


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_at", table_name="webhook_deliveries")
    op.drop_index("ix_engine_step_samples_at", table_name="engine_step_samples")
    op.drop_index("ix_request_outcomes_finished_at", table_name="request_outcomes")
    op.drop_column("teams", "storage_quota_bytes")
    op.drop_index("ix_files_expires_at", table_name="files")
    op.drop_column("files", "expires_at")
