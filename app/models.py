"""SQLAlchemy models shared by the API and the workers. Alembic (migrations/) owns the schema."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Annotated, Any

from sqlalchemy import (
    JSON,
    DateTime,
    ForeignKey,
    Index,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

__all__ = [
    "Base",
    "RequestStatus",
    "Priority",
    "InferenceRequest",
    "RequestEvent",
    "Instance",
    "EngineStepSample",
    "WebhookDelivery",
    "RequestOutcome",
    "Team",
    "ApiKey",
    "ModelVersion",
    "ModelStatus",
    "utcnow",
]


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite hands back naive ones)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


Timestamp = Annotated[datetime, mapped_column(UTCDateTime())]
OptionalTimestamp = Annotated[datetime | None, mapped_column(UTCDateTime())]


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class RequestStatus(enum.StrEnum):
    """Lifecycle of a request, in order; the last three are terminal."""

    QUEUED = "queued"
    PREDICTING = "predicting"
    ROUTED = "routed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset(
    {RequestStatus.SUCCEEDED, RequestStatus.FAILED, RequestStatus.CANCELLED}
)


class Priority(enum.StrEnum):
    INTERACTIVE = "interactive"
    BATCH = "batch"

    @property
    def rank(self) -> int:
        """Lower runs first, in the broker and inside the engine."""
        return 0 if self is Priority.INTERACTIVE else 1


class InferenceRequest(Base):
    """One inference request: what was asked, how it was predicted and routed, what came out."""

    __tablename__ = "requests"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    # The team whose API key submitted it: only that team sees it.
    team_id: Mapped[str | None] = mapped_column(ForeignKey("teams.id"))
    status: Mapped[str] = mapped_column(String(16), default=RequestStatus.QUEUED)
    priority: Mapped[str] = mapped_column(String(16), default=Priority.INTERACTIVE)
    # The text handed to the engine (chat messages rendered with the model's template).
    prompt: Mapped[str] = mapped_column(Text)
    messages: Mapped[list[Any] | None]
    max_tokens: Mapped[int]
    temperature: Mapped[float]
    top_p: Mapped[float]
    seed: Mapped[int | None]
    stop: Mapped[list[Any] | None]
    webhook_url: Mapped[str | None] = mapped_column(Text)
    # The engine worker streams output text to Redis as it is generated (OpenAI `stream: true`).
    stream: Mapped[bool] = mapped_column(default=False, server_default=false())
    request_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON)
    idempotency_key: Mapped[str | None] = mapped_column(String(255), unique=True)
    # SHA-256 of the canonical request body: same key + other body is a conflict.
    body_sha256: Mapped[str] = mapped_column(String(64))

    prompt_tokens: Mapped[int]
    predicted_output_tokens: Mapped[int | None]
    # The predictor's 90th percentile: an uncertainty the router may use.
    predicted_output_tokens_p90: Mapped[int | None]
    predictor: Mapped[str | None] = mapped_column(String(64))
    # The chosen instance's what-if (seconds from the routing decision), if the policy simulated.
    predicted_ttft_s: Mapped[float | None]
    predicted_e2e_s: Mapped[float | None]
    instance_id: Mapped[str | None] = mapped_column(String(64))
    policy: Mapped[str | None] = mapped_column(String(32))
    # The routing decision: candidates' scores, winner, decision time.
    routing: Mapped[dict[str, Any] | None]
    # Incremented at each routing; an engine runs a request only for the current attempt.
    attempt: Mapped[int] = mapped_column(default=0)

    output_text: Mapped[str | None] = mapped_column(Text)
    output_tokens: Mapped[int | None]
    finish_reason: Mapped[str | None] = mapped_column(String(16))
    error: Mapped[dict[str, Any] | None]

    created_at: Mapped[Timestamp] = mapped_column(default=utcnow)
    updated_at: Mapped[Timestamp] = mapped_column(default=utcnow, onupdate=utcnow)
    predicted_at: Mapped[OptionalTimestamp]
    routed_at: Mapped[OptionalTimestamp]
    started_at: Mapped[OptionalTimestamp]
    first_token_at: Mapped[OptionalTimestamp]
    finished_at: Mapped[OptionalTimestamp]

    events: Mapped[list[RequestEvent]] = relationship(
        back_populates="request", order_by="RequestEvent.id", cascade="all, delete-orphan"
    )

    __table_args__ = (
        Index("ix_requests_status_updated_at", "status", "updated_at"),
        Index("ix_requests_instance_id_status", "instance_id", "status"),
        Index("ix_requests_created_at", "created_at"),
        Index("ix_requests_team_id_created_at", "team_id", "created_at"),
    )


class RequestEvent(Base):
    """One status transition of a request, so every transition can be shown in order."""

    __tablename__ = "request_events"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(ForeignKey("requests.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16))
    at: Mapped[Timestamp] = mapped_column(default=utcnow)
    detail: Mapped[str | None] = mapped_column(Text)

    request: Mapped[InferenceRequest] = relationship(back_populates="events")

    __table_args__ = (Index("ix_request_events_request_id", "request_id", "id"),)


class Instance(Base):
    """An engine instance that has registered itself; live state is in Redis."""

    __tablename__ = "instances"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    engine_kind: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(255))
    config: Mapped[dict[str, Any]]
    started_at: Mapped[Timestamp]
    last_seen_at: Mapped[Timestamp]


class EngineStepSample(Base):
    """One engine step: batch composition and duration, for execution-time model fitting."""

    __tablename__ = "engine_step_samples"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    instance_id: Mapped[str] = mapped_column(String(64))
    at: Mapped[Timestamp]
    duration_ms: Mapped[float]
    num_seqs: Mapped[int]
    num_prefill_tokens: Mapped[int]
    num_decode_tokens: Mapped[int]
    num_running: Mapped[int]
    num_waiting: Mapped[int]
    kv_cache_usage: Mapped[float]

    __table_args__ = (Index("ix_engine_step_samples_instance_id_at", "instance_id", "at"),)


class WebhookDelivery(Base):
    """One attempt to deliver one webhook event."""

    __tablename__ = "webhook_deliveries"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(ForeignKey("requests.id", ondelete="CASCADE"))
    # webhook-id header: the same for every attempt of one event, so receivers can dedupe.
    event_id: Mapped[str] = mapped_column(String(64))
    event_type: Mapped[str] = mapped_column(String(64))
    url: Mapped[str] = mapped_column(Text)
    attempt: Mapped[int]
    status_code: Mapped[int | None]
    error: Mapped[str | None] = mapped_column(Text)
    succeeded: Mapped[bool]
    duration_ms: Mapped[float]
    at: Mapped[Timestamp] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_webhook_deliveries_request_id", "request_id", "attempt"),)


class RequestOutcome(Base):
    """The history row of one finished request: what was predicted and what happened.

    Written once, in the transaction that completes the request, and kept when requests are
    purged: the online loop trains and evaluates on it. Latencies are measured from the routing
    decision, the moment the routing what-if predicts from.
    """

    __tablename__ = "request_outcomes"

    request_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    finished_at: Mapped[Timestamp]
    model_name: Mapped[str] = mapped_column(String(255))
    instance_id: Mapped[str] = mapped_column(String(64))
    policy: Mapped[str | None] = mapped_column(String(32))
    predictor: Mapped[str | None] = mapped_column(String(64))
    prompt: Mapped[str] = mapped_column(Text)
    messages: Mapped[list[Any] | None]
    # Cheap prompt features (workers.predict.features), by name.
    features: Mapped[dict[str, Any]]
    prompt_tokens: Mapped[int]
    max_tokens: Mapped[int]
    predicted_output_tokens: Mapped[int | None]
    predicted_output_tokens_p90: Mapped[int | None]
    output_tokens: Mapped[int]
    finish_reason: Mapped[str | None] = mapped_column(String(16))
    predicted_ttft_s: Mapped[float | None]
    ttft_s: Mapped[float | None]
    predicted_e2e_s: Mapped[float | None]
    e2e_s: Mapped[float]

    __table_args__ = (Index("ix_request_outcomes_model_name_finished_at", "model_name",
                            "finished_at"),)


class ModelStatus(enum.StrEnum):
    CANDIDATE = "candidate"  # trained, evaluated, not promoted (it did not beat the active one)
    ACTIVE = "active"  # the one in use: at most one per (kind, scope)
    RETIRED = "retired"  # was active; a rollback may bring it back


class ModelVersion(Base):
    """The model registry: every trained length model and execution-time model, with metrics."""

    __tablename__ = "model_versions"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))  # "length" | "exec"
    # What the model is for: the serving model's name (length), the instance id (exec).
    scope: Mapped[str] = mapped_column(String(255))
    version: Mapped[int]
    status: Mapped[str] = mapped_column(String(16), default=ModelStatus.CANDIDATE)
    training_rows: Mapped[int]
    # Candidate and active version on the same held-out slice, and the fit's own metrics.
    metrics: Mapped[dict[str, Any]]
    artifact: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[Timestamp] = mapped_column(default=utcnow)
    promoted_at: Mapped[OptionalTimestamp]
    note: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        UniqueConstraint("kind", "scope", "version"),
        Index("ix_model_versions_kind_scope_status", "kind", "scope", "status"),
    )


class Team(Base):
    """A tenant: its API keys, requests, files and batches are visible only to it."""

    __tablename__ = "teams"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    # Weight of the team's batch work against other teams' (fair share).
    share: Mapped[int] = mapped_column(default=1)
    # Requests per minute over all endpoints; None: the configured default.
    rate_limit_rpm: Mapped[int | None]
    # Where batch events go (signed like request webhooks); None: no batch webhooks.
    webhook_url: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[Timestamp] = mapped_column(default=utcnow)


class ApiKey(Base):
    """An API key of a team. Only the SHA-256 of the key is stored; the key is shown once."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    team_id: Mapped[str] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(255))
    key_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    # The first characters of the key, to recognise it in listings.
    key_prefix: Mapped[str] = mapped_column(String(16))
    is_admin: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[Timestamp] = mapped_column(default=utcnow)
    revoked_at: Mapped[OptionalTimestamp]
