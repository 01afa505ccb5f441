"""Responses of the OpenAI-compatible endpoints, shaped exactly as OpenAI shapes them, from a
finished request (and, for streaming, from its text deltas)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from domain.models import InferenceRequest

__all__ = ["completion_object", "chat_completion_object", "completion_chunk", "chat_chunk",
           "usage_of", "finish_reason_of", "response_id", "completion_logprobs", "chat_logprobs",
           "KIND_CHAT", "KIND_COMPLETION"]

KIND_CHAT = "chat.completion"
KIND_COMPLETION = "text_completion"


def response_id(request_id: str, kind: str) -> str:
    """`chatcmpl-...` / `cmpl-...`: the request id with OpenAI's prefix."""
    prefix = "chatcmpl-" if kind == KIND_CHAT else "cmpl-"
    return prefix + request_id.removeprefix("req_")


def finish_reason_of(request: InferenceRequest) -> str:
    """OpenAI's finish_reason: `length` when max_tokens cut the answer, else `stop`."""
    return "length" if request.finish_reason == "length" else "stop"


def usage_of(request: InferenceRequest) -> dict[str, int]:
    completion = request.output_tokens or 0
    return {"prompt_tokens": request.prompt_tokens, "completion_tokens": completion,
            "total_tokens": request.prompt_tokens + completion}


def _usage_of_choices(requests: Sequence[InferenceRequest], n: int) -> dict[str, int]:
    """OpenAI's usage of a call: each prompt counted once (the first of its n choices), every
    choice's output counted."""
    prompt = sum(r.prompt_tokens for r in requests[::n])
    completion = sum(r.output_tokens or 0 for r in requests)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _created(request: InferenceRequest) -> int:
    return int(request.created_at.timestamp())


def _choices(requests: InferenceRequest | Sequence[InferenceRequest]) -> list[InferenceRequest]:
    return [requests] if isinstance(requests, InferenceRequest) else list(requests)


def completion_object(requests: InferenceRequest | Sequence[InferenceRequest], model: str, *,
                      n: int = 1) -> dict[str, Any]:
    """The response of /v1/completions: one choice per request, in order (`n` choices per
    prompt); the id and creation time are the first request's."""
    rows = _choices(requests)
    first = rows[0]
    return {
        "id": response_id(first.id, KIND_COMPLETION),
        "object": KIND_COMPLETION,
        "created": _created(first),
        "model": model,
        "choices": [{"text": _completion_text(row), "index": index,
                     "logprobs": completion_logprobs(row),
                     "finish_reason": finish_reason_of(row)}
                    for index, row in enumerate(rows)],
        "usage": _usage_of_choices(rows, n),
        "system_fingerprint": None,
    }


def chat_completion_object(requests: InferenceRequest | Sequence[InferenceRequest], model: str,
                           *, n: int = 1) -> dict[str, Any]:
    rows = _choices(requests)
    first = rows[0]
    return {
        "id": response_id(first.id, KIND_CHAT),
        "object": KIND_CHAT,
        "created": _created(first),
        "model": model,
        "choices": [{
            "index": index,
            "message": {"role": "assistant", "content": row.output_text or "",
                        "refusal": None},
            "logprobs": chat_logprobs(row),
            "finish_reason": finish_reason_of(row),
        } for index, row in enumerate(rows)],
        "usage": _usage_of_choices(rows, n),
        "system_fingerprint": None,
    }


def _sampling(request: InferenceRequest) -> dict[str, Any]:
    return request.sampling or {}


def _completion_text(request: InferenceRequest) -> str:
    """The choice's text: with echo, the prompt first (alone with max_tokens 0)."""
    sampling = _sampling(request)
    output = request.output_text or ""
    if not sampling.get("echo"):
        return output
    return request.prompt if sampling.get("prompt_only") else request.prompt + output


def completion_logprobs(request: InferenceRequest) -> dict[str, Any] | None:
    """OpenAI's `logprobs` of a completion choice (tokens, token_logprobs, top_logprobs,
    text_offset), from the stored ones; with echo the prompt's tokens come first (the first has
    no logprob: nothing precedes it). None when logprobs were not asked for."""
    sampling, stored = _sampling(request), request.logprobs
    if sampling.get("logprobs") is None or stored is None:
        return None
    entries: list[dict[str, Any]] = []
    if sampling.get("echo"):
        entries += stored.get("prompt") or []
    if not sampling.get("prompt_only"):
        entries += stored.get("output") or []
    offsets, offset = [], 0
    for entry in entries:
        offsets.append(offset)
        offset += len(entry["token"])
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [None if e["logprob"] is None else
                         {t["token"]: t["logprob"] for t in e["top"]} for e in entries],
        "text_offset": offsets,
    }


def chat_logprobs(request: InferenceRequest) -> dict[str, Any] | None:
    """OpenAI's chat `logprobs` ({"content": [...], "refusal": None}): each output token with
    its bytes and its `top_logprobs` most likely alternatives."""
    sampling, stored = _sampling(request), request.logprobs
    top = sampling.get("logprobs")
    if top is None or stored is None:
        return None

    def token(entry: dict[str, Any]) -> dict[str, Any]:
        return {"token": entry["token"], "logprob": entry["logprob"],
                "bytes": list(entry["token"].encode())}

    return {"content": [
        {**token(e), "top_logprobs": [token(t) for t in sorted(e["top"], key=_rank)
                                      if t["rank"] <= top]}
        for e in stored.get("output") or []], "refusal": None}


def _rank(entry: dict[str, Any]) -> int:
    return int(entry["rank"])


def completion_chunk(request: InferenceRequest, model: str, text: str,
                     finish_reason: str | None) -> dict[str, Any]:
    """One server-sent event of a streamed completion."""
    return {
        "id": response_id(request.id, KIND_COMPLETION),
        "object": KIND_COMPLETION,
        "created": _created(request),
        "model": model,
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}],
        "system_fingerprint": None,
    }


def chat_chunk(request: InferenceRequest, model: str, delta: dict[str, Any],
               finish_reason: str | None) -> dict[str, Any]:
    """One server-sent event of a streamed chat completion (`delta` as OpenAI sends it)."""
    return {
        "id": response_id(request.id, KIND_CHAT),
        "object": "chat.completion.chunk",
        "created": _created(request),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None,
                     "finish_reason": finish_reason}],
        "system_fingerprint": None,
    }
