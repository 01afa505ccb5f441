"""file contents in PostgreSQL: the Files API's bytes in chunks, readable from every host

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05 03:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The bytes of a file (BLOCKQ_FILES_STORAGE=database) as numbered chunks of at most 1 MiB
    # (domain/file_bytes.py): streamed in and out a chunk at a time, deleted with a plain DELETE.
    # No foreign key to `files`: the bytes are written (and committed) before the file's row.
    op.create_table(
        "file_chunks",
        sa.Column("file_id", sa.String(40), primary_key=True),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("file_chunks")
