"""files and batches

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29 21:53:01.272690
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _timestamp(name: str, *, nullable: bool) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "batches",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("team_id", sa.String(length=40), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("final_status", sa.String(length=16), nullable=True),
        sa.Column("endpoint", sa.String(length=64), nullable=False),
        sa.Column("input_file_id", sa.String(length=40), nullable=False),
        sa.Column("completion_window", sa.String(length=8), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.Column("model", sa.String(length=255), nullable=True),
        sa.Column("num_lines", sa.Integer(), nullable=True),
        sa.Column("errors", sa.JSON(), nullable=True),
        sa.Column("output_file_id", sa.String(length=40), nullable=True),
        sa.Column("error_file_id", sa.String(length=40), nullable=True),
        _timestamp("created_at", nullable=False),
        _timestamp("updated_at", nullable=False),
        _timestamp("expires_at", nullable=False),
        *(_timestamp(f"{stage}_at", nullable=True) for stage in (
            "in_progress", "finalizing", "completed", "failed", "expired", "cancelling",
            "cancelled")),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_batches_team_id_teams"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batches")),
    )
    op.create_index("ix_batches_status_expires_at", "batches", ["status", "expires_at"])
    op.create_index("ix_batches_team_id_created_at", "batches", ["team_id", "created_at"])
    op.create_table(
        "files",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("team_id", sa.String(length=40), nullable=False),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        _timestamp("created_at", nullable=False),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_files_team_id_teams"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_files")),
    )
    op.create_index("ix_files_team_id_created_at", "files", ["team_id", "created_at"])
    op.create_table(
        "batch_lines",
        sa.Column("batch_id", sa.String(length=40), nullable=False),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("custom_id", sa.Text(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("request_id", sa.String(length=40), nullable=False),
        sa.Column("fields", sa.JSON(), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["batch_id"], ["batches.id"],
                                name=op.f("fk_batch_lines_batch_id_batches"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("batch_id", "line", name=op.f("pk_batch_lines")),
    )
    op.create_index("ix_batch_lines_batch_id_status", "batch_lines", ["batch_id", "status", "line"])
    # NOTE: batch mode, so that SQLite (the embedded demo database) can add the foreign keys
    # and relax the NOT NULL.
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("batch_id", sa.String(length=40), nullable=True))
        batch.add_column(sa.Column("custom_id", sa.Text(), nullable=True))
        batch.add_column(sa.Column("batch_line", sa.Integer(), nullable=True))
        batch.create_index("ix_requests_batch_id_status", ["batch_id", "status"])
        batch.create_foreign_key(op.f("fk_requests_batch_id_batches"), "batches", ["batch_id"],
                                 ["id"])
    with op.batch_alter_table("webhook_deliveries") as batch:
        batch.add_column(sa.Column("batch_id", sa.String(length=40), nullable=True))
        batch.alter_column("request_id", existing_type=sa.String(length=40), nullable=True)
        batch.create_index("ix_webhook_deliveries_batch_id", ["batch_id", "attempt"])
        batch.create_foreign_key(op.f("fk_webhook_deliveries_batch_id_batches"), "batches",
                                 ["batch_id"], ["id"], ondelete="CASCADE")


def downgrade() -> None:
    # Batch events have no request: their delivery rows go before request_id is NOT NULL again.
    op.execute("DELETE FROM webhook_deliveries WHERE request_id IS NULL")
    with op.batch_alter_table("webhook_deliveries") as batch:
        batch.drop_constraint(op.f("fk_webhook_deliveries_batch_id_batches"), type_="foreignkey")
        batch.drop_index("ix_webhook_deliveries_batch_id")
        batch.alter_column("request_id", existing_type=sa.String(length=40), nullable=False)
        batch.drop_column("batch_id")
    with op.batch_alter_table("requests") as batch:
        batch.drop_constraint(op.f("fk_requests_batch_id_batches"), type_="foreignkey")
        batch.drop_index("ix_requests_batch_id_status")
        batch.drop_column("batch_line")
        batch.drop_column("custom_id")
        batch.drop_column("batch_id")
    op.drop_index("ix_batch_lines_batch_id_status", table_name="batch_lines")
    op.drop_table("batch_lines")
    op.drop_index("ix_files_team_id_created_at", table_name="files")
    op.drop_table("files")
    op.drop_index("ix_batches_team_id_created_at", table_name="batches")
    op.drop_index("ix_batches_status_expires_at", table_name="batches")
    op.drop_table("batches")
