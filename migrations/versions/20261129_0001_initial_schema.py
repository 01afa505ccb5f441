"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29 17:57:24.452832
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "engine_step_samples",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("instance_id", sa.String(length=64), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration_ms", sa.Double(), nullable=False),
        sa.Column("num_seqs", sa.Integer(), nullable=False),
        sa.Column("num_prefill_tokens", sa.Integer(), nullable=False),
        sa.Column("num_decode_tokens", sa.Integer(), nullable=False),
        sa.Column("num_running", sa.Integer(), nullable=False),
        sa.Column("num_waiting", sa.Integer(), nullable=False),
        sa.Column("kv_cache_usage", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_engine_step_samples")),
    )
    op.create_index(
        "ix_engine_step_samples_instance_id_at",
        "engine_step_samples",
        ["instance_id", "at"],
        unique=False,
    )
    op.create_table(
        "instances",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("engine_kind", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=255), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instances")),
    )
    op.create_table(
        "requests",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("priority", sa.String(length=16), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("messages", sa.JSON(), nullable=True),
        sa.Column("max_tokens", sa.Integer(), nullable=False),
        sa.Column("temperature", sa.Double(), nullable=False),
        sa.Column("top_p", sa.Double(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=True),
        sa.Column("stop", sa.JSON(), nullable=True),
        sa.Column("webhook_url", sa.Text(), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("body_sha256", sa.String(length=64), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("predicted_output_tokens", sa.Integer(), nullable=True),
        sa.Column("predictor", sa.String(length=64), nullable=True),
        sa.Column("instance_id", sa.String(length=64), nullable=True),
        sa.Column("policy", sa.String(length=32), nullable=True),
        sa.Column("routing", sa.JSON(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("output_text", sa.Text(), nullable=True),
        sa.Column("output_tokens", sa.Integer(), nullable=True),
        sa.Column("finish_reason", sa.String(length=16), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("predicted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("routed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("first_token_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_requests")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_requests_idempotency_key")),
    )
    op.create_index("ix_requests_created_at", "requests", ["created_at"], unique=False)
    op.create_index(
        "ix_requests_instance_id_status", "requests", ["instance_id", "status"], unique=False
    )
    op.create_index(
        "ix_requests_status_updated_at", "requests", ["status", "updated_at"], unique=False
    )
    op.create_table(
        "request_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("request_id", sa.String(length=40), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["request_id"],
            ["requests.id"],
            name=op.f("fk_request_events_request_id_requests"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_request_events")),
    )
    op.create_index(
        "ix_request_events_request_id", "request_events", ["request_id", "id"], unique=False
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("request_id", sa.String(length=40), nullable=False),
        sa.Column("event_id", sa.String(length=64), nullable=False),
        sa.Column("event_type", sa.String(length=64), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("succeeded", sa.Boolean(), nullable=False),
        sa.Column("duration_ms", sa.Double(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["request_id"],
            ["requests.id"],
            name=op.f("fk_webhook_deliveries_request_id_requests"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
    )
    op.create_index(
        "ix_webhook_deliveries_request_id",
        "webhook_deliveries",
        ["request_id", "attempt"],
        unique=False,
    )


def downgrade() -> None:

    op.drop_index("ix_webhook_deliveries_request_id", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_index("ix_request_events_request_id", table_name="request_events")
    op.drop_table("request_events")
    op.drop_index("ix_requests_status_updated_at", table_name="requests")
    op.drop_index("ix_requests_instance_id_status", table_name="requests")
    op.drop_index("ix_requests_created_at", table_name="requests")
    op.drop_table("requests")
    op.drop_table("instances")
    op.drop_index("ix_engine_step_samples_instance_id_at", table_name="engine_step_samples")
    op.drop_table("engine_step_samples")
