"""learning history and model registry

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 21:25:49.415076
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("scope", sa.String(length=255), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("training_rows", sa.Integer(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("artifact", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("promoted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_versions")),
        sa.UniqueConstraint("kind", "scope", "version", name=op.f("uq_model_versions_kind")),
    )
    op.create_index(
        "ix_model_versions_kind_scope_status",
        "model_versions",
        ["kind", "scope", "status"],
        unique=False,
    )
    op.create_table(
        "request_outcomes",
        sa.Column("request_id", sa.String(length=40), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("model_name", sa.String(length=255), nullable=False),
        sa.Column("instance_id", sa.String(length=64), nullable=False),
        sa.Column("policy", sa.String(length=32), nullable=True),
        sa.Column("predictor", sa.String(length=64), nullable=True),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("messages", sa.JSON(), nullable=True),
        sa.Column("features", sa.JSON(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("max_tokens", sa.Integer(), nullable=False),
        sa.Column("predicted_output_tokens", sa.Integer(), nullable=True),
        sa.Column("predicted_output_tokens_p90", sa.Integer(), nullable=True),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("finish_reason", sa.String(length=16), nullable=True),
        sa.Column("predicted_ttft_s", sa.Double(), nullable=True),
        sa.Column("ttft_s", sa.Double(), nullable=True),
        sa.Column("predicted_e2e_s", sa.Double(), nullable=True),
        sa.Column("e2e_s", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("request_id", name=op.f("pk_request_outcomes")),
    )
    op.create_index(
        "ix_request_outcomes_model_name_finished_at",
        "request_outcomes",
        ["model_name", "finished_at"],
        unique=False,
    )
    op.add_column("requests", sa.Column("predicted_output_tokens_p90", sa.Integer(), nullable=True))
    op.add_column("requests", sa.Column("predicted_ttft_s", sa.Double(), nullable=True))
    op.add_column("requests", sa.Column("predicted_e2e_s", sa.Double(), nullable=True))


def downgrade() -> None:
    op.drop_column("requests", "predicted_e2e_s")
    op.drop_column("requests", "predicted_ttft_s")
    op.drop_column("requests", "predicted_output_tokens_p90")
    op.drop_index("ix_request_outcomes_model_name_finished_at", table_name="request_outcomes")
    op.drop_table("request_outcomes")
    op.drop_index("ix_model_versions_kind_scope_status", table_name="model_versions")
    op.drop_table("model_versions")
