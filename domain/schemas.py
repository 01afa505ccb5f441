"""Request bodies accepted by the native API, validated with pydantic."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
)

from domain.errors import InvalidRequest
from domain.sampling import INTEGER, MAX_LOGPROBS, NUMBER, SamplingFields, TokenId, is_token_ids
from domain.slo import SloTargets
from domain.webhook_targets import url_problem

__all__ = ["ChatMessage", "CreateRequest", "parse_body"]

M = TypeVar("M", bound=BaseModel)

#: Seeds are below this: `requests.seed` is a PostgreSQL integer (a larger seed failed the
#: insert with a 500; found by tests/app/test_fuzz_api.py).
SEED_LIMIT = 2**31


def stop_as_list(value: Any) -> Any:
    """`stop` may be one string or a list of them, as in OpenAI's API: always a list."""
    return [value] if isinstance(value, str) else value


class TextPart(BaseModel):
    """One content part of a chat message, as OpenAI's clients send them (text only)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text"] = Field(description="Only text parts are supported.")
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart] = Field(description=(
        "The text, or a list of text parts (joined; `vllm bench serve` sends these)."))

    @field_validator("content", mode="before")
    @classmethod
    def _content_form(cls, value: Any) -> Any:
        """A clear refusal (pydantic's union errors name its internal types)."""
        if isinstance(value, str) or (isinstance(value, list) and all(
                isinstance(part, dict) and part.get("type") == "text"
                and isinstance(part.get("text"), str) and set(part) == {"type", "text"}
                for part in value)):
            return value
        raise ValueError('content must be a string or a list of text parts '
                         '({"type": "text", "text": "..."}); other parts are not supported')

    @field_validator("content")
    @classmethod
    def _joined(cls, value: str | list[TextPart]) -> str:
        return value if isinstance(value, str) else "".join(part.text for part in value)


class CreateRequest(SamplingFields):
    """Body of POST /v1/requests: exactly one of prompt or messages. The sampling parameters of
    vLLM and OpenAI (domain.sampling.SamplingFields) are accepted too."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(
        None, min_length=1, description="The served model to run it (GET /v1/models lists "
        "those up). Unset: the first model of the fleet (BLOCKQ_FLEET, else BLOCKQ_MODEL_NAME). "
        "A model no instance has ever served is a 404; while every instance of it is down, the "
        "request waits for one.")
    prompt: Annotated[str, Field(min_length=1)] | Annotated[
        list[TokenId], Field(min_length=1)] | None = Field(
        None, description="The prompt text, or its token ids (handed to the engine as they are).")
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    max_tokens: Annotated[int | None, INTEGER] = Field(
        None, ge=0, description="Most output tokens; 0 only with echo (score the prompt alone).")
    logprobs: Annotated[int | None, INTEGER] = Field(
        None, ge=0, le=MAX_LOGPROBS,
        description="Return each output token's log probability and this many most likely "
                    "alternatives (vLLM engine; the emulated engine returns synthetic ones).")
    echo: StrictBool = Field(
        False, description="OpenAI's echo: with logprobs, the prompt tokens' logprobs are "
                           "returned too.")
    temperature: Annotated[float, NUMBER] = Field(1.0, ge=0.0, le=2.0)
    top_p: Annotated[float, NUMBER] = Field(1.0, gt=0.0, le=1.0)
    seed: Annotated[int | None, INTEGER] = Field(None, ge=0, lt=SEED_LIMIT)
    stop: list[str] | None = Field(None, max_length=4)
    priority: Literal["interactive", "batch"] = "interactive"
    webhook_url: AnyHttpUrl | None = None
    metadata: dict[str, Any] | None = None
    slo: SloTargets | None = Field(
        None, description="Latency targets (interactive requests): the router picks an "
                          "instance predicted to meet them; the team's slo_miss_action says "
                          "what happens when none can.")
    session_id: str | None = Field(
        None, min_length=1, max_length=256,
        description="The conversation this request belongs to (also the x-session-id "
                    "header): its turns go to the instance that served the previous one, "
                    "which holds its prefix in cache, while that instance has room.")

    _stop_as_list = field_validator("stop", mode="before")(stop_as_list)

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_form(cls, value: Any) -> Any:
        """A clear refusal (pydantic's union errors name its internal types)."""
        if value is None or (isinstance(value, str) and value) or is_token_ids(value):
            return value
        raise ValueError("prompt must be a non-empty string or a non-empty list of token ids "
                         "(integers from 0)")

    @field_validator("webhook_url")
    @classmethod
    def _webhook_url_on_its_face(cls, value: AnyHttpUrl | None) -> AnyHttpUrl | None:
        """Refused without DNS: credentials in it, too long (literal addresses: request_fields,
        which knows the allow-list; resolved ones: the webhook worker)."""
        problem = url_problem(str(value)) if value is not None else None
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata_small(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and len(value) > 16:
            raise ValueError("at most 16 metadata keys")
        return value

    def model_post_init(self, _context: Any) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise InvalidRequest("Give exactly one of 'prompt' or 'messages'.", param="prompt")
        if self.max_tokens == 0 and not self.echo:
            raise InvalidRequest("max_tokens must be at least 1 (0 only with echo, to score the "
                                 "prompt).", param="max_tokens", code="invalid_value")
        if self.slo is not None and self.priority != "interactive":
            raise InvalidRequest("Latency targets (slo) are for interactive requests.",
                                 param="slo", code="invalid_value")


def parse_body(model: type[M], body: Any) -> M:
    """Validate a JSON body; the first problem becomes a 400 naming the field."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        message = f"Invalid value for '{param}': {first['msg']}" if param else first["msg"]
        code = "unknown_parameter" if first["type"] == "extra_forbidden" else "invalid_value"
        raise InvalidRequest(message, param=param, code=code) from None
