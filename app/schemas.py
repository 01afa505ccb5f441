"""Request bodies accepted by the native API, validated with pydantic."""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.errors import InvalidRequest

__all__ = ["ChatMessage", "CreateRequest", "parse_body"]

M = TypeVar("M", bound=BaseModel)


def stop_as_list(value: Any) -> Any:
    """`stop` may be one string or a list of them, as in OpenAI's API: always a list."""
    return [value] if isinstance(value, str) else value


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str


class CreateRequest(BaseModel):
    """Body of POST /v1/requests: exactly one of prompt or messages."""

    model_config = ConfigDict(extra="forbid")

    prompt: str | None = Field(None, min_length=1)
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: list[str] | None = Field(None, max_length=4)
    priority: Literal["interactive", "batch"] = "interactive"
    webhook_url: AnyHttpUrl | None = None
    metadata: dict[str, Any] | None = None

    _stop_as_list = field_validator("stop", mode="before")(stop_as_list)

    @field_validator("metadata")
    @classmethod
    def _metadata_small(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and len(value) > 16:
            raise ValueError("at most 16 metadata keys")
        return value

    def model_post_init(self, _context: Any) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise InvalidRequest("Give exactly one of 'prompt' or 'messages'.", param="prompt")


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
