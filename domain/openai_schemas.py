"""Bodies of the OpenAI-compatible endpoints (`/v1/completions`, `/v1/chat/completions`), and
their translation to a native request. The Batch API validates each line with the same models."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, StrictBool, field_validator, model_validator

from domain.errors import InvalidRequest, NotFound
from domain.sampling import INTEGER, MAX_LOGPROBS, NUMBER, SamplingFields, TokenId, is_token_ids
from domain.schemas import SEED_LIMIT, ChatMessage, stop_as_list
from domain.slo import SloTargets

__all__ = ["CompletionBody", "ChatCompletionBody", "OpenAIBody", "body_model_for", "check_model",
           "native_body", "native_bodies", "MAX_CHOICES"]


#: OpenAI's default max_tokens of /v1/completions (chat completions default to the context).
LEGACY_COMPLETION_MAX_TOKENS = 16
#: Most choices one call may ask for (prompts times n), OpenAI's limit on n.
MAX_CHOICES = 128

_PROMPT_FORMS = ("a string, a list of strings, a list of token ids or a list of lists of token "
                 "ids")


class _Common(SamplingFields):
    """Parameters both endpoints share, and vLLM's extra sampling parameters (SamplingFields).
    Unknown parameters are refused, as OpenAI does; the ones we accept without acting on them
    must keep their neutral value."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    max_tokens: Annotated[int | None, INTEGER] = Field(None, ge=1)
    temperature: Annotated[float, NUMBER] = Field(1.0, ge=0.0, le=2.0)
    top_p: Annotated[float, NUMBER] = Field(1.0, gt=0.0, le=1.0)
    seed: Annotated[int | None, INTEGER] = Field(None, ge=0, lt=SEED_LIMIT, description=(
        "Sampling seed; with n > 1, choice j of a prompt uses seed + j."))
    stop: list[str] | None = Field(None, max_length=4)
    stream: StrictBool = False
    stream_options: dict[str, Any] | None = None
    n: Annotated[int, INTEGER] = Field(1, ge=1, le=MAX_CHOICES, description=(
        f"Choices per prompt (each a request of its own); prompts times n at most "
        f"{MAX_CHOICES}."))
    user: str | None = None
    metadata: dict[str, str] | None = None
    slo: SloTargets | None = Field(None, description=(
        "blockq's extension: latency targets of each choice (also the x-slo-ttft-ms and "
        "x-slo-e2e-ms headers); not in a batch line."))

    _stop_as_list = field_validator("stop", mode="before")(stop_as_list)

    @property
    def include_usage_in_stream(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompts of the call, each a text or token ids (chat: one, its messages)."""
        return [""]

    @property
    def wants_logprobs(self) -> bool:
        return False

    def _check_choices(self) -> None:
        num_choices = len(self.prompts) * self.n
        if num_choices > MAX_CHOICES:
            raise InvalidRequest(f"{len(self.prompts)} prompts times n={self.n} make "
                                 f"{num_choices} choices; at most {MAX_CHOICES}.", param="n",
                                 code="invalid_value")
        if self.stream and num_choices > 1:
            raise InvalidRequest("Streaming gives one choice: send one prompt with n=1, or "
                                 "set stream to false.", param="n" if self.n > 1 else "prompt",
                                 code="invalid_value")
        if self.stream and self.wants_logprobs:
            raise InvalidRequest("logprobs are not available with stream: set stream to "
                                 "false to receive them.", param="logprobs",
                                 code="invalid_value")


def _prompt_form(value: Any) -> Any:
    """A clear refusal of a prompt of none of OpenAI's forms (pydantic's union errors name
    its internal types)."""
    ok = (isinstance(value, str) and value) or (isinstance(value, list) and bool(value) and (
        is_token_ids(value) or all(isinstance(p, str) and p for p in value)
        or all(is_token_ids(p) for p in value)))
    if not ok:
        raise ValueError(f"prompt must be {_PROMPT_FORMS} (none of them empty; token ids are "
                         "integers from 0)")
    return value


class CompletionBody(_Common):
    prompt: Annotated[str, Field(min_length=1)] | list[TokenId] | list[
        Annotated[str, Field(min_length=1)]] | list[list[TokenId]] = Field(description=(
            f"The prompt: {_PROMPT_FORMS}. Token ids go to the engine as they are; several "
            "prompts give one choice each, in order."))
    max_tokens: Annotated[int | None, INTEGER] = Field(None, ge=0, description=(
        "Most output tokens (default 16); 0 only with echo: the answer is the prompt and its "
        "logprobs (the engine generates one token, left out)."))
    echo: StrictBool = Field(
        False, description="Begin each choice with its prompt (and its logprobs).")
    logprobs: Annotated[int | None, INTEGER] = Field(None, ge=0, le=MAX_LOGPROBS, description=(
        "Return the log probability of each token and of this many most likely alternatives."))
    suffix: None = None
    best_of: Annotated[int | None, INTEGER] = Field(
        None, description="Only best_of equal to n (or absent).")

    _prompt_form = field_validator("prompt", mode="before")(_prompt_form)

    @property
    def prompts(self) -> list[str | list[int]]:
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            return [prompt]  # type: ignore[list-item]
        return list(prompt)  # type: ignore[arg-type]

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    @model_validator(mode="after")
    def _consistent(self) -> CompletionBody:
        if self.max_tokens == 0 and not self.echo:
            raise InvalidRequest("max_tokens must be at least 1 (0 only with echo, to score the "
                                 "prompt).", param="max_tokens", code="invalid_value")
        if self.echo and self.stream:
            raise InvalidRequest("echo is not available with stream: set stream to false.",
                                 param="echo", code="invalid_value")
        if self.best_of is not None and self.best_of != self.n:
            raise InvalidRequest("best_of other than n is not supported.", param="best_of",
                                 code="invalid_value")
        self._check_choices()
        return self


class ChatCompletionBody(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Annotated[int | None, INTEGER] = Field(None, ge=1)
    logprobs: StrictBool | None = Field(None, description=(
        "Return the log probability of each output token."))
    top_logprobs: Annotated[int | None, INTEGER] = Field(None, ge=0, le=MAX_LOGPROBS, description=(
        "With logprobs: this many most likely alternatives of each output token."))

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.logprobs)

    @model_validator(mode="after")
    def _one_limit(self) -> ChatCompletionBody:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise InvalidRequest("Give max_tokens or max_completion_tokens, not both.",
                                 param="max_completion_tokens")
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest("top_logprobs needs logprobs set to true.",
                                 param="top_logprobs", code="invalid_value")
        self._check_choices()
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


def native_bodies(body: OpenAIBody, *, priority: str = "interactive") -> list[dict[str, Any]]:
    """The native requests (POST /v1/requests bodies) that run this OpenAI request: one per
    choice, in OpenAI's choice order (prompt by prompt, n choices each)."""
    common: dict[str, Any] = {
        "model": body.model,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "priority": priority,
    }
    if isinstance(body, ChatCompletionBody):
        common["messages"] = [m.model_dump() for m in body.messages]
        limit = body.max_completion_tokens or body.max_tokens
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
    else:
        limit = LEGACY_COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        logprobs = body.logprobs
        common["echo"] = body.echo
    slo = body.slo.model_dump(exclude_none=True) if body.slo is not None else None
    for key, value in (("max_tokens", limit), ("stop", body.stop), ("metadata", body.metadata),
                       ("logprobs", logprobs), ("slo", slo)):
        if value is not None:
            common[key] = value
    for key in SamplingFields.model_fields:
        if (value := getattr(body, key)) is not None:
            common[key] = value
    natives = []
    for prompt in body.prompts:
        for choice in range(body.n):
            native = dict(common)
            if isinstance(body, CompletionBody):
                native["prompt"] = prompt
            if body.seed is not None:
                native["seed"] = (body.seed + choice) % SEED_LIMIT
            natives.append(native)
    return natives


def native_body(body: OpenAIBody, *, priority: str = "interactive") -> dict[str, Any]:
    """The one native request of a batch line: a line runs one choice."""
    if body.slo is not None:
        raise InvalidRequest("Latency targets (slo) are for interactive calls, not batch lines.",
                             param="slo", code="invalid_value")
    natives = native_bodies(body, priority=priority)
    if len(natives) > 1:
        raise InvalidRequest("A batch line runs one choice: give one prompt and n=1 (a line "
                             "per choice).", param="n" if body.n > 1 else "prompt",
                             code="invalid_value")
    return natives[0]
