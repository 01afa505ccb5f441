"""The API's response objects as pydantic models: the OpenAPI document (`app.api.openapi`) takes
their JSON Schema, and the fuzz test checks every answer against it.

Each model forbids fields it does not name (`additionalProperties: false` in the document), so a
field added to a response without being added here fails the response-conformance check instead
of drifting silently away from the document. Request bodies are the models the endpoints parse
with (domain/schemas.py, domain/openai_schemas.py, domain/batches.py), not copies.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from domain.file_quota import MAX_EXPIRES_AFTER_S, MIN_EXPIRES_AFTER_S
from domain.models import BatchStatus, FilePurpose, Priority, RequestStatus

__all__ = [
    "ErrorResponse", "SubmittedRequest", "RequestObject", "ModelObject", "ModelList",
    "CompletionObject", "ChatCompletionObject", "CompletionChunk", "ChatCompletionChunk",
    "FileObject", "FileList", "FileDeleted", "FileUpload", "BatchObject", "BatchList",
    "InstanceList", "InstanceControl", "QueuesObject", "RoutingState", "RoutingPolicyBody",
    "TeamWebhookSecretObject", "TeamObject", "TeamSettingsBody",
    "Healthz", "Readyz",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- errors ---------------------------------------------------------------------------------

class ErrorDetail(_Strict):
    message: str = Field(description="What is wrong, naming the problem.")
    type: str = Field(description="OpenAI's error type: invalid_request_error, server_error, "
                      "requests (rate limits).")
    param: str | None = Field(description="The parameter at fault, if any.")
    code: str | None = Field(description="A machine-readable code, e.g. invalid_value.")


class ErrorResponse(_Strict):
    """The OpenAI-style error object every 4xx and 5xx answer carries."""

    error: ErrorDetail


# --- native requests ------------------------------------------------------------------------

class SubmittedRequest(_Strict):
    """The answer to POST /v1/requests: the request is queued; poll `status_url`."""

    id: str
    object: Literal["request"]
    status: RequestStatus
    status_url: str
    created: bool = Field(description="False when an earlier submission with the same "
                          "Idempotency-Key is returned.")


class RequestEventObject(_Strict):
    status: RequestStatus
    at: str | None
    detail: str | None


class SloObject(_Strict):
    """A request's latency targets (milliseconds from creation) and whether it met them."""

    ttft_ms: float | None
    e2e_ms: float | None
    miss_action: Literal["route", "queue", "refuse"] | None = Field(
        description="Its team's slo_miss_action when it was accepted.")
    ttft_met: bool | None = Field(description="Once succeeded: whether the first token came "
                                  "within ttft_ms (null without that target).")
    e2e_met: bool | None = Field(description="Once succeeded: whether it ended within e2e_ms.")
    met: bool | None = Field(description="Every target met; false when it was rejected; null "
                             "until it is over.")


class RequestObject(_Strict):
    """A request: what was predicted and routed, and what came out."""

    id: str
    object: Literal["request"]
    status: RequestStatus
    model: str | None = Field(description="The served model that runs it.")
    priority: Priority
    prompt_tokens: int
    output_tokens: int | None
    predicted_output_tokens: int | None
    predicted_output_tokens_p90: int | None
    predictor: str | None
    predicted_ttft_s: float | None
    predicted_e2e_s: float | None
    max_tokens: int
    instance_id: str | None
    policy: str | None
    routing: dict[str, Any] | None
    attempt: int
    output: str | None
    finish_reason: str | None
    error: dict[str, Any] | None
    metadata: dict[str, Any] | None
    created_at: str | None
    predicted_at: str | None
    routed_at: str | None
    started_at: str | None
    first_token_at: str | None
    finished_at: str | None
    sampling: dict[str, Any] | None = Field(
        None, description="Sampling parameters the client set beyond the columns above.")
    logprobs: dict[str, Any] | None = Field(
        None, description="Log probabilities the engine returned, when asked for.")
    events: list[RequestEventObject] | None = None
    slo: SloObject | None = Field(None, description="Its latency targets, if it has any.")


# --- OpenAI-compatible ----------------------------------------------------------------------

class ModelObject(_Strict):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(_Strict):
    object: Literal["list"]
    data: list[ModelObject]


class Usage(_Strict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


FinishReason = Literal["stop", "length"]


class CompletionChoice(_Strict):
    text: str
    index: int
    logprobs: dict[str, Any] | None
    finish_reason: FinishReason


class CompletionObject(_Strict):
    """POST /v1/completions with `stream: false`."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    system_fingerprint: str | None


class ChatMessageOut(_Strict):
    role: Literal["assistant"]
    content: str | None
    refusal: str | None


class ChatChoice(_Strict):
    index: int
    message: ChatMessageOut
    logprobs: dict[str, Any] | None
    finish_reason: FinishReason


class ChatCompletionObject(_Strict):
    """POST /v1/chat/completions with `stream: false`."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None


class CompletionChunkChoice(_Strict):
    text: str
    index: int
    logprobs: dict[str, Any] | None
    finish_reason: FinishReason | None


class CompletionChunk(_Strict):
    """One `data:` event of a streamed completion; with `stream_options.include_usage` each
    carries `usage: null` and a last one has no choices and the usage."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    system_fingerprint: str | None
    usage: Usage | None = None


class ChatDelta(_Strict):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Strict):
    index: int
    delta: ChatDelta
    logprobs: dict[str, Any] | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(_Strict):
    """One `data:` event of a streamed chat completion (see CompletionChunk for usage)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    system_fingerprint: str | None
    usage: Usage | None = None


# --- files ----------------------------------------------------------------------------------

class FileUpload(_Strict):
    """The multipart/form-data body of POST /v1/files."""

    file: bytes = Field(json_schema_extra={"contentMediaType": "application/octet-stream"},
                        description="The file (a batch input file: JSON Lines).")
    purpose: Literal["batch"] = Field(description="Why it is uploaded (batch input files).")
    expires_after_anchor: Literal["created_at"] | None = Field(
        None, alias="expires_after[anchor]", description="OpenAI's `expires_after.anchor`.")
    expires_after_seconds: int | None = Field(
        None, alias="expires_after[seconds]", ge=MIN_EXPIRES_AFTER_S, le=MAX_EXPIRES_AFTER_S,
        description="The file expires this many seconds after its creation (with the anchor).")


class FileObject(_Strict):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    filename: str
    purpose: FilePurpose
    status: Literal["processed"]
    expires_at: int | None
    status_details: str | None


class FileList(_Strict):
    object: Literal["list"]
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(_Strict):
    id: str
    object: Literal["file"]
    deleted: bool


# --- batches --------------------------------------------------------------------------------

class BatchError(BaseModel):
    code: str | None = None
    message: str | None = None
    param: str | None = None
    line: int | None = None


class BatchErrors(_Strict):
    object: Literal["list"]
    data: list[BatchError]


class RequestCounts(_Strict):
    total: int
    completed: int
    failed: int


class InputTokensDetails(_Strict):
    cached_tokens: int


class OutputTokensDetails(_Strict):
    reasoning_tokens: int


class BatchUsage(_Strict):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class BatchEstimate(_Strict):
    """blockq's completion estimate of a running batch (workers/batch/estimates.py): when its
    last line is estimated to finish, when that was estimated, whether it is within the
    completion window; all null before the first estimate and once the batch ended."""

    estimated_completion_at: int | None
    estimated_at: int | None
    meets_completion_window: bool | None
    remaining_lines: int | None
    lines_per_s: float | None


class BatchObject(_Strict):
    """OpenAI's Batch object, and blockq's own fields under `blockq`."""

    id: str
    object: Literal["batch"]
    endpoint: str
    model: str | None
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    expires_at: int | None
    in_progress_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None
    usage: BatchUsage
    blockq: BatchEstimate


class BatchList(_Strict):
    object: Literal["list"]
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


# --- instances and operations ---------------------------------------------------------------

class RoutingState(_Strict):
    """The routing in force: the configured policy, the operator's override, the bias watch's
    fallback ({reason, model, errors, since, until}) and the policy that routes now."""

    configured_policy: str
    override: str | None
    fallback: dict[str, Any] | None
    policy: str


class RoutingPolicyBody(_Strict):
    """Body of PUT /v1/admin/routing: a policy name, or null to restore the configured one."""

    policy: str | None


class EngineConfig(_Strict):
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    block_size: int | None
    max_model_len: int | None


class InstanceDetail(_Strict):
    id: str
    object: Literal["instance"]
    alive: bool
    accepting: bool
    control: str | None
    engine_kind: str | None
    model: str | None = Field(description="The model the instance serves (requests name it).")
    model_path: str | None = Field(description="The model directory its engine loaded.")
    hardware: str | None = Field(description="Its device: a CUDA device name, `cpu` (vLLM on "
                                 "CPUs) or `emulated`.")
    exec_model: str | None = Field(description="An emulated instance's hardware: the "
                                   "execution-time model it runs on (e.g. llama-2-7b-a100).")
    capacity_rps: float | None = Field(description="Requests per second the instance completes "
                                       "saturated, as its operator declared it: the weight of "
                                       "capacity_weighted routing (null: not declared).")
    running: int
    waiting: int
    assigned: int
    free_kv_blocks: int | None
    total_kv_blocks: int | None
    seconds_since_heartbeat: float | None
    config: EngineConfig


class InstanceList(_Strict):
    object: Literal["list"]
    data: list[InstanceDetail]
    routing: RoutingState


class InstanceControl(_Strict):
    """An instance after drain, pause or resume."""

    id: str
    object: Literal["instance"]
    alive: bool
    accepting: bool
    control: str | None


class TeamWebhookSecretObject(_Strict):
    """A team's new webhook signing secret, returned once by a rotation."""

    object: Literal["team.webhook_secret"]
    team_id: str
    secret: str = Field(description="`whsec_<base64>`: shown only in this answer.")
    previous_valid_until: int | None = Field(
        description="Unix time until which the previous secret also signs the team's events "
        "(null: the team had none).")


class TeamObject(_Strict):
    """A team's settings, as an admin sees and changes them."""

    id: str
    object: Literal["team"]
    name: str
    share: int
    rate_limit_rpm: int | None
    slo_miss_action: Literal["route", "queue", "refuse"] = Field(description=(
        "What happens to its requests whose latency targets no instance can meet: route them "
        "anyway (to the closest instance), queue them (run as batch work), or refuse them "
        "(status rejected; a held OpenAI call answers 429 with Retry-After)."))


class TeamSettingsBody(_Strict):
    """Body of PATCH /v1/admin/teams/{team_id}: the settings to change."""

    slo_miss_action: Literal["route", "queue", "refuse"]


class QueueDepth(_Strict):
    queue: str
    waiting: int
    by_priority: dict[str, int]


class InstanceQueue(_Strict):
    id: str
    queued: int
    assigned: int
    running: int
    waiting: int
    control: str | None


class QueuesObject(_Strict):
    object: Literal["queues"]
    queues: list[QueueDepth]
    instances: list[InstanceQueue]


# --- probes ---------------------------------------------------------------------------------

class Healthz(_Strict):
    status: Literal["ok"]


class ReadyChecks(_Strict):
    database: str
    broker: str


class Readyz(_Strict):
    status: Literal["ready", "not_ready"]
    checks: ReadyChecks
