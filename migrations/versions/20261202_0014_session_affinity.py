"""a request's session key, for session affinity at routing

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02 01:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A digest of the team and the client's session id (x-session-id, or OpenAI's `user`):
    # the router keeps the conversation on the instance that served its previous turn
    # (workers/route/affinity.py). The id itself is not stored.
    op.add_column("requests", sa.Column("session_key", sa.String(length=32), nullable=True))


def downgrade() -> None:
    op.drop_column("requests", "session_key")
