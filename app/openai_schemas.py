"""Bodies of the OpenAI-compatible endpoints (`/v1/completions`, `/v1/chat/completions`), and
their translation to a native request. The Batch API validates each line with the same models."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.errors import InvalidRequest, NotFound
from app.schemas import ChatMessage, stop_as_list

__all__ = ["CompletionBody", "ChatCompletionBody", "OpenAIBody", "body_model_for", "check_model",
           "native_body"]


#: OpenAI's default max_tokens of /v1/completions (chat completions default to the context).
LEGACY_COMPLETION_MAX_TOKENS = 16


class _Common(BaseModel):
    """Parameters both endpoints share. Unknown parameters are refused, as OpenAI does; the
    ones we accept without acting on them must keep their neutral value."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: list[str] | None = Field(None, max_length=4)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: Literal[1] = 1
    user: str | None = None
    frequency_penalty: Literal[0, 0.0] = 0
    presence_penalty: Literal[0, 0.0] = 0
    logit_bias: dict[str, float] | None = None
    metadata: dict[str, str] | None = None

    _stop_as_list = field_validator("stop", mode="before")(stop_as_list)

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("logit_bias is not supported")
        return value

    @property
    def include_usage_in_stream(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class CompletionBody(_Common):
    prompt: str = Field(min_length=1)
    echo: Literal[False] = False
    logprobs: None = None
    suffix: None = None
    best_of: Literal[1] | None = None


class ChatCompletionBody(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: Literal[False] | None = None

    @model_validator(mode="after")
    def _one_limit(self) -> ChatCompletionBody:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise InvalidRequest("Give max_tokens or max_completion_tokens, not both.",
                                 param="max_completion_tokens")
        return self


OpenAIBody = CompletionBody | ChatCompletionBody

_ENDPOINT_BODIES: dict[str, type[CompletionBody] | type[ChatCompletionBody]] = {
    "/v1/completions": CompletionBody,
    "/v1/chat/completions": ChatCompletionBody,
}


def body_model_for(endpoint: str) -> type[CompletionBody] | type[ChatCompletionBody]:
    try:
        return _ENDPOINT_BODIES[endpoint]
    except KeyError:
        raise InvalidRequest(f"Unsupported endpoint '{endpoint}': use one of "
                             f"{', '.join(_ENDPOINT_BODIES)}.", param="endpoint") from None


def check_model(body: OpenAIBody, served_model: str) -> None:
    if body.model != served_model:
        raise NotFound(f"The model '{body.model}' does not exist.", param="model",
                       code="model_not_found")


def native_body(body: OpenAIBody, *, priority: str = "interactive") -> dict[str, Any]:
    """The native request (POST /v1/requests body) that runs this OpenAI request."""
    native: dict[str, Any] = {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "priority": priority,
    }
    if isinstance(body, ChatCompletionBody):
        native["messages"] = [m.model_dump() for m in body.messages]
        limit = body.max_completion_tokens or body.max_tokens
    else:
        native["prompt"] = body.prompt
        limit = body.max_tokens or LEGACY_COMPLETION_MAX_TOKENS
    for key, value in (("max_tokens", limit), ("seed", body.seed), ("stop", body.stop),
                       ("metadata", body.metadata)):
        if value is not None:
            native[key] = value
    return native
