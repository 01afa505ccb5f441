"""Responses of the OpenAI-compatible endpoints, shaped exactly as OpenAI shapes them, from a
finished request (and, for streaming, from its text deltas)."""

from __future__ import annotations

from typing import Any

from app.models import InferenceRequest

__all__ = ["completion_object", "chat_completion_object", "completion_chunk", "chat_chunk",
           "usage_of", "finish_reason_of", "response_id", "KIND_CHAT", "KIND_COMPLETION"]

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


def _created(request: InferenceRequest) -> int:
    return int(request.created_at.timestamp())


def completion_object(request: InferenceRequest, model: str) -> dict[str, Any]:
    return {
        "id": response_id(request.id, KIND_COMPLETION),
        "object": KIND_COMPLETION,
        "created": _created(request),
        "model": model,
        "choices": [{"text": request.output_text or "", "index": 0, "logprobs": None,
                     "finish_reason": finish_reason_of(request)}],
        "usage": usage_of(request),
        "system_fingerprint": None,
    }


def chat_completion_object(request: InferenceRequest, model: str) -> dict[str, Any]:
    return {
        "id": response_id(request.id, KIND_CHAT),
        "object": KIND_CHAT,
        "created": _created(request),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": request.output_text or "",
                        "refusal": None},
            "logprobs": None,
            "finish_reason": finish_reason_of(request),
        }],
        "usage": usage_of(request),
        "system_fingerprint": None,
    }


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
