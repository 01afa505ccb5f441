"""per-team webhook signing secrets

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 12:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass  # filled in by the work that owns this revision


def downgrade() -> None:
    pass  # filled in by the work that owns this revision
