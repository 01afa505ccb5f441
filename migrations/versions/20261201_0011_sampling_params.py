"""sampling parameters of OpenAI and vLLM clients

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 12:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The sampling parameters beyond the common ones (vLLM's extras, penalties, logit_bias,
    # logprobs, echo), only those a client set; a prompt given as token ids; the logprobs the
    # engine returned, for the OpenAI responses and GET /v1/requests/<id>.
    op.add_column("requests", sa.Column("sampling", sa.JSON(), nullable=True))
    op.add_column("requests", sa.Column("prompt_token_ids", sa.JSON(), nullable=True))
    op.add_column("requests", sa.Column("logprobs", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("requests", "logprobs")
    op.drop_column("requests", "prompt_token_ids")
    op.drop_column("requests", "sampling")
