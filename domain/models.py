"""SQLAlchemy models shared by the API and the workers. Alembic (migrations/) owns the schema."""

from __future__ import annotations

import enum
import re
from datetime import UTC, datetime
from typing import Annotated, Any

from sqlalchemy import (
    JSON,
    REAL,
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    literal,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

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
    "TeamWebhookSecret",
    "ModelVersion",
    "ModelStatus",
    "StoredFile",
    "FileChunk",
    "FilePurpose",
    "Batch",
    "BatchStatus",
    "BatchLine",
    "LineStatus",
    "OutboxEntry",
    "OperatorControl",
    "utcnow",
    "database_now",
]


def utcnow() -> datetime:
    return datetime.now(UTC)


#: Starts a stored text that was escaped (`ExactText`): U+0001, then a tag no text of ours starts
#: with by chance.
_ESCAPED_MARK = "\x01blockq-escaped:"
_UNESCAPE = re.compile(r"\\([\\0])")


class ExactText(TypeDecorator[str]):
    """Text that round-trips exactly, NUL included, on every backend.

    PostgreSQL text cannot hold NUL (U+0000), which prompts and answers may contain (vLLM's
    server takes them). A value with a NUL, or one that starts with the mark, is stored as the
    mark followed by the value with backslashes doubled and each NUL written as a backslash and
    a zero; any other value (almost all) is stored as it is, so rows written before this type
    read back unchanged and stay readable by SQL."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Any) -> str | None:
        if value is None or ("\x00" not in value and not value.startswith(_ESCAPED_MARK)):
            return value
        return _ESCAPED_MARK + value.replace("\\", "\\\\").replace("\x00", "\\0")

    def process_result_value(self, value: str | None, dialect: Any) -> str | None:
        if value is None or not value.startswith(_ESCAPED_MARK):
            return value
        return _UNESCAPE.sub(_unescaped, value[len(_ESCAPED_MARK):])


def _unescaped(found: re.Match[str]) -> str:
    return "\x00" if found.group(1) == "0" else "\\"


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


class database_now(FunctionElement[datetime]):  # noqa: N801 - an SQL function, named as one
    """The database's clock, `seconds_ago` back: the one clock that times several hosts
    compare are read from (a request's `updated_at` against the sweep's cutoff), so that a
    host whose own clock is off cannot make work look stale or fresh. PostgreSQL's `now()`
    (its transaction's start); on SQLite, a file on one host, that host's clock, in the text
    form SQLAlchemy stores datetimes in."""

    type = UTCDateTime()
    inherit_cache = True

    def __init__(self, seconds_ago: float = 0.0) -> None:
        super().__init__(literal(float(seconds_ago)))


@compiles(database_now, "postgresql")
def _database_now_postgresql(element: database_now, compiler: SQLCompiler, **kw: Any) -> str:
    return f"(now() - {compiler.process(element.clauses, **kw)} * interval '1 second')"


@compiles(database_now)
def _database_now_sqlite(element: database_now, compiler: SQLCompiler, **kw: Any) -> str:
    seconds = compiler.process(element.clauses, **kw)
    return f"strftime('%Y-%m-%d %H:%M:%f000', 'now', -({seconds}) || ' seconds')"


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
    """Lifecycle of a request, in order; the last four are terminal (`rejected`: refused at
    routing because no instance could meet its latency targets, domain/slo.py)."""

    QUEUED = "queued"
    PREDICTING = "predicting"
    ROUTED = "routed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset(
    {RequestStatus.SUCCEEDED, RequestStatus.FAILED, RequestStatus.CANCELLED,
     RequestStatus.REJECTED}
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
    # The served model asked for (OpenAI's `model`): only its instances run it. None: a
    # request made before models were recorded (the default model's).
    model: Mapped[str | None] = mapped_column(String(255))
    # The text handed to the engine (chat messages rendered with the model's template).
    prompt: Mapped[str] = mapped_column(ExactText)
    messages: Mapped[list[Any] | None]
    max_tokens: Mapped[int]
    temperature: Mapped[float]
    top_p: Mapped[float]
    seed: Mapped[int | None]
    stop: Mapped[list[Any] | None]
    # Sampling parameters beyond the columns above, only those the client set (domain.sampling):
    # vLLM's extras, penalties, logit_bias, logprobs, echo.
    sampling: Mapped[dict[str, Any] | None]
    # A prompt given as token ids goes to the engine as these ids (`prompt` holds their text).
    prompt_token_ids: Mapped[list[Any] | None]
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
    # Latency targets (domain/slo.py), milliseconds from created_at; None: no such target.
    slo_ttft_ms: Mapped[float | None] = mapped_column(REAL)
    slo_e2e_ms: Mapped[float | None] = mapped_column(REAL)
    # The team's slo_miss_action when the request was accepted (set with a target).
    slo_miss_action: Mapped[str | None] = mapped_column(String(8))
    # Whether the finished request met each target (None: no such target, or not finished).
    slo_ttft_met: Mapped[bool | None]
    slo_e2e_met: Mapped[bool | None]
    # A digest of the team and the client's session id (domain/sessions.py): the router keeps a
    # session on the instance that served its previous turn; None: no session.
    session_key: Mapped[str | None] = mapped_column(String(32))
    # Set when the request runs one line of a batch (/v1/batches): the batch, the line's
    # custom_id and its 1-based line number in the input file.
    batch_id: Mapped[str | None] = mapped_column(ForeignKey("batches.id"))
    custom_id: Mapped[str | None] = mapped_column(ExactText)
    batch_line: Mapped[int | None]

    output_text: Mapped[str | None] = mapped_column(ExactText)
    output_tokens: Mapped[int | None]
    finish_reason: Mapped[str | None] = mapped_column(String(16))
    error: Mapped[dict[str, Any] | None]
    # Logprobs the engine returned when asked (workers.serve.engine.GenerationResult.logprobs).
    logprobs: Mapped[dict[str, Any] | None]

    created_at: Mapped[Timestamp] = mapped_column(default=utcnow)
    # NOTE: by the database's clock: the sweep compares it with its cutoff across hosts.
    updated_at: Mapped[Timestamp] = mapped_column(default=database_now(),
                                                  onupdate=database_now())
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
        Index("ix_requests_batch_id_status", "batch_id", "status"),
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


class ServedModel(Base):
    """A model some instance has declared it serves, ever (domain/served_models.py): a request
    for it is accepted while its instances are down, one for any other model is a 404."""

    __tablename__ = "served_models"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    # The model directory its last instance loaded (the API's tokenizer for it).
    model_path: Mapped[str] = mapped_column(Text)
    first_declared_at: Mapped[Timestamp]
    last_declared_at: Mapped[Timestamp]


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
    # The execution-time model's context features (workers.sim.exec_model.BatchStats); 0 where
    # the engine does not know them.
    decode_context_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    prefill_chunk_x_context: Mapped[int] = mapped_column(BigInteger, default=0,
                                                         server_default="0")
    prefill_chunk_sq: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")

    __table_args__ = (
        Index("ix_engine_step_samples_instance_id_at", "instance_id", "at"),
        Index("ix_engine_step_samples_at", "at"),  # the retention purge
    )


class WebhookDelivery(Base):
    """One attempt to deliver one webhook event: of a request, or of a batch."""

    __tablename__ = "webhook_deliveries"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    request_id: Mapped[str | None] = mapped_column(ForeignKey("requests.id", ondelete="CASCADE"))
    batch_id: Mapped[str | None] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"))
    # webhook-id header: the same for every attempt of one event, so receivers can dedupe.
    event_id: Mapped[str] = mapped_column(String(64))
    event_type: Mapped[str] = mapped_column(String(64))
    url: Mapped[str] = mapped_column(Text)
    attempt: Mapped[int]
    status_code: Mapped[int | None]
    error: Mapped[str | None] = mapped_column(Text)
    succeeded: Mapped[bool]
    # No further attempt: the destination is refused (not a public address, or a bad URL).
    permanent: Mapped[bool] = mapped_column(default=False, server_default=false())
    duration_ms: Mapped[float]
    at: Mapped[Timestamp] = mapped_column(default=utcnow)

    __table_args__ = (
        Index("ix_webhook_deliveries_request_id", "request_id", "attempt"),
        Index("ix_webhook_deliveries_batch_id", "batch_id", "attempt"),
        Index("ix_webhook_deliveries_at", "at"),  # the retention purge
    )


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
    prompt: Mapped[str] = mapped_column(ExactText)
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

    __table_args__ = (
        Index("ix_request_outcomes_model_name_finished_at", "model_name", "finished_at"),
        Index("ix_request_outcomes_finished_at", "finished_at"),  # the retention purge
    )


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
    # Bytes of stored files the team may hold; None: the configured default.
    storage_quota_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # What happens to its requests whose latency targets no instance can meet (domain/slo.py).
    slo_miss_action: Mapped[str] = mapped_column(String(8), default="route",
                                                 server_default="route")
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


class TeamWebhookSecret(Base):
    """A signing secret of a team's webhook events (Standard Webhooks, `whsec_<base64>`).

    The current one has no `expires_at`. A rotation gives the previous one an `expires_at` at the
    end of the grace period; until then events carry a signature made with each. Kept as is, not
    hashed: signing (HMAC) needs the secret itself.
    """

    __tablename__ = "team_webhook_secrets"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    team_id: Mapped[str] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    secret: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[Timestamp] = mapped_column(default=utcnow)
    expires_at: Mapped[OptionalTimestamp]

    __table_args__ = (Index("ix_team_webhook_secrets_team_id", "team_id"),)


class FilePurpose(enum.StrEnum):
    BATCH = "batch"  # uploaded: a batch input file
    BATCH_OUTPUT = "batch_output"  # written by blockq: a batch's output or error file


class StoredFile(Base):
    """A file of the Files API. The bytes live in the files directory or in `file_chunks`
    (domain.file_bytes), named by the id; this row is what the API lists and shows."""

    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    team_id: Mapped[str] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(255))
    size_bytes: Mapped[int] = mapped_column("bytes", BigInteger)
    created_at: Mapped[Timestamp] = mapped_column(default=utcnow)
    # OpenAI's `expires_after`: the retention purge deletes the file (row and bytes) after it.
    expires_at: Mapped[OptionalTimestamp]

    __table_args__ = (
        Index("ix_files_team_id_created_at", "team_id", "created_at"),
        Index("ix_files_expires_at", "expires_at"),
    )


class FileChunk(Base):
    """Part of a file's bytes when files are stored in the database (domain.file_bytes): chunk `seq`
    (0, 1, ...) of file `file_id`. Written before the file's row exists, so no foreign key."""

    __tablename__ = "file_chunks"

    file_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class BatchStatus(enum.StrEnum):
    """OpenAI's batch lifecycle: validating -> in_progress -> finalizing -> completed, or
    failed (the input file), expired (the window passed), cancelling -> cancelled."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


class Batch(Base):
    """A batch of requests read from an input file (/v1/batches)."""

    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    team_id: Mapped[str] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16), default=BatchStatus.VALIDATING)
    # The terminal status finalization will set: completed, cancelled or expired.
    final_status: Mapped[str | None] = mapped_column(String(16))
    endpoint: Mapped[str] = mapped_column(String(64))
    # No foreign key: a batch keeps naming its files after they are deleted, as OpenAI's do.
    input_file_id: Mapped[str] = mapped_column(String(40))
    completion_window: Mapped[str] = mapped_column(String(8))
    batch_metadata: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON)
    # The served model, once a line asked for it.
    model: Mapped[str | None] = mapped_column(String(255))
    # Lines in the input file, once it is read.
    num_lines: Mapped[int | None]
    # Why the batch failed: OpenAI's BatchError objects (code, message, param, line).
    errors: Mapped[list[Any] | None]
    output_file_id: Mapped[str | None] = mapped_column(String(40))
    error_file_id: Mapped[str | None] = mapped_column(String(40))
    # OpenAI's `output_expires_after.seconds`: the output and error files expire this long after
    # they are written (None: they never expire).
    output_expires_after_s: Mapped[int | None]

    created_at: Mapped[Timestamp] = mapped_column(default=utcnow)
    updated_at: Mapped[Timestamp] = mapped_column(default=utcnow, onupdate=utcnow)
    expires_at: Mapped[Timestamp]
    in_progress_at: Mapped[OptionalTimestamp]
    finalizing_at: Mapped[OptionalTimestamp]
    completed_at: Mapped[OptionalTimestamp]
    failed_at: Mapped[OptionalTimestamp]
    expired_at: Mapped[OptionalTimestamp]
    cancelling_at: Mapped[OptionalTimestamp]
    cancelled_at: Mapped[OptionalTimestamp]

    __table_args__ = (
        Index("ix_batches_team_id_created_at", "team_id", "created_at"),
        Index("ix_batches_status_expires_at", "status", "expires_at"),
    )


class LineStatus(enum.StrEnum):
    PENDING = "pending"  # valid, not released yet: no request row exists
    RELEASED = "released"  # its request exists; the request's status says the rest
    INVALID = "invalid"  # failed validation; `error` says why; never runs
    CANCELLED = "cancelled"  # never released: the batch was cancelled or expired first


class BatchLine(Base):
    """One line of a batch's input file, from expansion to finalization.

    NOTE: valid lines wait here, not in `requests`, until the releaser lets them run: the
    orphan sweep re-enqueues stale queued requests, and must never start what the releaser
    holds back. A released line's request has the id `request_id` given at expansion.
    """

    __tablename__ = "batch_lines"

    batch_id: Mapped[str] = mapped_column(
        ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True
    )
    line: Mapped[int] = mapped_column(primary_key=True)  # 1-based, in the input file
    custom_id: Mapped[str | None] = mapped_column(ExactText)
    status: Mapped[str] = mapped_column(String(16))
    request_id: Mapped[str] = mapped_column(String(40))
    # The request's columns (domain.commands.request_fields) until release, then None.
    fields: Mapped[dict[str, Any] | None]
    # Why an invalid line was refused: status_code, and OpenAI's error object fields.
    error: Mapped[dict[str, Any] | None]
    # The line's prefix group (workers.batch.prefix_groups): the number of the batch's first
    # line whose prompt opens with the same tokens, or its own number when the prompt is too
    # short or engines cache no prefixes. The releaser releases by (prefix_group, line): lines
    # that share a prefix one after another, groups in order of first appearance. None: a
    # line expanded before groups existed (all of its batch's are: file order).
    prefix_group: Mapped[int | None]

    # Pending lines in release order for the releaser; counts by status.
    __table_args__ = (Index("ix_batch_lines_batch_id_status_prefix_group", "batch_id", "status",
                            "prefix_group", "line"),)


class OutboxEntry(Base):
    """A task message staged in the transaction whose commit it must follow (the transactional
    outbox): sent once that transaction committed, deleted once sent. A crash or a broker
    outage in between leaves the entry here for the relay (domain/outbox.py) to send."""

    __tablename__ = "outbox"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    task: Mapped[str] = mapped_column(String(64))
    queue: Mapped[str] = mapped_column(String(64))
    args: Mapped[list[Any]]
    kwargs: Mapped[dict[str, Any]]
    priority: Mapped[int]
    created_at: Mapped[Timestamp] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_outbox_created_at", "created_at"),)


class OperatorControl(Base):
    """An operator's standing decision: a hold on an instance (`instance:<id>` -> "drained",
    "paused", or the autoscaler's "scaling_down") or the routing-policy override
    (`routing:policy` -> a policy name). Kept here so that it survives a Redis restart;
    routers read the copy in Redis, which the health sweep restores from this table."""

    __tablename__ = "operator_controls"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    value: Mapped[str] = mapped_column(String(64))
    updated_at: Mapped[Timestamp] = mapped_column(default=utcnow, onupdate=utcnow)
