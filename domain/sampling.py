"""Sampling parameters beyond temperature, top_p, seed and stop: vLLM's extras (`top_k`, `min_p`,
`repetition_penalty`, `ignore_eos`, `min_tokens`, `stop_token_ids`) and OpenAI's penalties and
`logit_bias`, as clients such as `vllm bench serve` and the `openai` package send them.

`SamplingFields` is the one pydantic model of them, shared by the native body (domain.schemas) and
the OpenAI bodies (domain.openai_schemas); `sampling_column` is what a request stores of them (the
`sampling` column: only the parameters a client set, plus logprobs and echo), which the engine
worker hands to the engine. Token ids are checked against the model's vocabulary by
`check_token_ids` once the tokenizer is at hand (domain.commands).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt
from pydantic_core import PydanticCustomError

from domain.errors import InvalidRequest

__all__ = ["SamplingFields", "TokenId", "is_token_ids", "MAX_LOGPROBS", "sampling_column",
           "check_token_ids", "INTEGER", "NUMBER"]

#: Most alternatives per token a client may ask for (vLLM's default max_logprobs).
MAX_LOGPROBS = 20
MAX_STOP_TOKEN_IDS = 64
#: OpenAI's limit on logit_bias entries.
MAX_LOGIT_BIAS = 300


def _json_number(kind: str) -> BeforeValidator:
    """A number given as a JSON number: a string ("5") or a boolean (true) is the wrong type,
    refused with 400, though pydantic's lax mode (and vLLM's server, whose models are lax) would
    read them as 5 and 1. A whole number written 5.0 is still the integer 5, as JSON Schema's
    `integer` has it."""

    def check(value: Any) -> Any:
        if isinstance(value, str | bool):
            raise PydanticCustomError(
                "wrong_type", "Input should be {kind}, not {given}",
                {"kind": kind, "given": "a boolean" if isinstance(value, bool) else "a string"})
        return value

    return BeforeValidator(check)


#: Markers of number fields, e.g. `Annotated[int | None, INTEGER]` (around the whole optional
#: type: the field's bounds stay in its JSON schema).
INTEGER = _json_number("an integer")
NUMBER = _json_number("a number")

TokenId = Annotated[StrictInt, Field(ge=0)]
#: A token id as a JSON object key (a string of digits).
TokenIdKey = Annotated[int, Field(ge=0)]
Bias = Annotated[float, Field(ge=-100.0, le=100.0, allow_inf_nan=False), NUMBER]

#: The fields of SamplingFields, as the `sampling` column stores them.
_ENGINE_KEYS = ("top_k", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty",
                "ignore_eos", "min_tokens", "stop_token_ids", "logit_bias")


class SamplingFields(BaseModel):
    """Sampling parameters of vLLM and OpenAI beyond the common ones. Each is optional; null or
    absent means the engine's neutral default."""

    model_config = ConfigDict(extra="forbid")

    top_k: Annotated[int | None, INTEGER] = Field(
        None, ge=-1, description="Sample from the k most likely tokens only; -1 or 0: all.")
    min_p: Annotated[float | None, NUMBER] = Field(
        None, ge=0.0, le=1.0, allow_inf_nan=False,
        description="Drop tokens less likely than min_p times the most likely one's probability.")
    repetition_penalty: Annotated[float | None, NUMBER] = Field(
        None, gt=0.0, le=2.0, allow_inf_nan=False,
        description="vLLM's repetition penalty: above 1 discourages tokens already in the prompt "
                    "or output, below 1 encourages them; 1 is neutral.")
    frequency_penalty: Annotated[float | None, NUMBER] = Field(
        None, ge=-2.0, le=2.0, allow_inf_nan=False,
        description="OpenAI's frequency penalty: lowers a token's logit by this times its count "
                    "in the output so far.")
    presence_penalty: Annotated[float | None, NUMBER] = Field(
        None, ge=-2.0, le=2.0, allow_inf_nan=False,
        description="OpenAI's presence penalty: lowers the logit of every token already in the "
                    "output by this much.")
    ignore_eos: StrictBool | None = Field(
        None, description="Keep generating past the end-of-sequence token, up to max_tokens.")
    min_tokens: Annotated[int | None, INTEGER] = Field(
        None, ge=0, description="Generate at least this many tokens before EOS or a stop token "
                                "may end the output (at most max_tokens).")
    stop_token_ids: list[TokenId] | None = Field(
        None, max_length=MAX_STOP_TOKEN_IDS,
        description="Token ids that end the output when generated (they are not shown).")
    logit_bias: dict[TokenIdKey, Bias] | None = Field(
        None, max_length=MAX_LOGIT_BIAS,
        json_schema_extra={"propertyNames": {"pattern": "^[0-9]+$"}},
        description="Token id (a string key, as in OpenAI's API) -> bias in [-100, 100] added to "
                    "that token's logit before sampling.")


def is_token_ids(value: Any) -> bool:
    """A non-empty list of token ids (integers from 0, booleans excluded)."""
    return isinstance(value, list) and bool(value) and all(
        type(token) is int and token >= 0 for token in value)


def sampling_column(parsed: SamplingFields, *, logprobs: int | None = None,
                    echo: bool = False, prompt_only: bool = False) -> dict[str, Any] | None:
    """What the `sampling` column stores: the parameters the client set (JSON-ready: logit_bias
    keys are strings), `logprobs` (alternatives per token, when asked for), `echo` (OpenAI's:
    the prompt's logprobs too) and `prompt_only` (OpenAI's echo with max_tokens 0: the answer
    is the prompt alone). None when there is nothing to store."""
    column: dict[str, Any] = {
        key: value for key in _ENGINE_KEYS if (value := getattr(parsed, key)) is not None}
    if parsed.logit_bias is not None:
        column["logit_bias"] = {str(token): bias for token, bias in parsed.logit_bias.items()}
    if logprobs is not None:
        column["logprobs"] = logprobs
    if echo:
        column["echo"] = True
    if prompt_only:
        column["prompt_only"] = True
    return column or None


def check_token_ids(parsed: SamplingFields, vocab_size: int, *, max_tokens: int) -> None:
    """Token ids the model has, and min_tokens within max_tokens; else 400 naming the field."""
    for token in parsed.stop_token_ids or ():
        _check_token(token, vocab_size, "stop_token_ids")
    for token in parsed.logit_bias or {}:
        _check_token(token, vocab_size, "logit_bias")
    if parsed.min_tokens is not None and parsed.min_tokens > max_tokens:
        raise InvalidRequest(f"min_tokens is {parsed.min_tokens} but max_tokens is {max_tokens}: "
                             "min_tokens must not exceed it.", param="min_tokens",
                             code="invalid_value")


def _check_token(token: int, vocab_size: int, param: str) -> None:
    if token >= vocab_size:
        raise InvalidRequest(f"Invalid value for '{param}': token id {token} is not in the "
                             f"model's vocabulary (ids 0 to {vocab_size - 1}).", param=param,
                             code="invalid_value")
