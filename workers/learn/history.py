"""The request history the online loop learns from: written at completion, read for training."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from domain.models import EngineStepSample, InferenceRequest, RequestOutcome
from workers.predict.features import FEATURE_NAMES, extract

__all__ = ["record_outcome", "length_rows", "step_samples"]


def record_outcome(session: Session, request_id: str, *, model_name: str) -> bool:
    """Write the history row of a request that just succeeded, in the completing transaction.

    Called once per request: only by the transition that completed it.
    """
    request = session.get(InferenceRequest, request_id)
    if request is None or request.instance_id is None or request.finished_at is None:
        return False
    prompt = request.messages or request.prompt
    features = extract(prompt, num_prompt_tokens=request.prompt_tokens)
    session.execute(insert(RequestOutcome).values(
        request_id=request.id,
        finished_at=request.finished_at,
        model_name=model_name,
        instance_id=request.instance_id,
        policy=request.policy,
        predictor=request.predictor,
        prompt=request.prompt,
        messages=request.messages,
        features={name: round(float(v), 6) for name, v in zip(FEATURE_NAMES, features,
                                                               strict=True)},
        prompt_tokens=request.prompt_tokens,
        max_tokens=request.max_tokens,
        predicted_output_tokens=request.predicted_output_tokens,
        predicted_output_tokens_p90=request.predicted_output_tokens_p90,
        output_tokens=request.output_tokens or 0,
        finish_reason=request.finish_reason,
        predicted_ttft_s=request.predicted_ttft_s,
        ttft_s=_seconds(request.routed_at, request.first_token_at),
        predicted_e2e_s=request.predicted_e2e_s,
        e2e_s=_seconds(request.routed_at, request.finished_at) or 0.0,
    ))
    return True


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else (end - start).total_seconds()


def length_rows(session: Session, model_name: str, *, limit: int) -> list[dict[str, Any]]:
    """The latest `limit` finished requests of a serving model, oldest first, as training rows
    (`prompt`, `model`, `output_tokens`, plus `max_tokens` and `finished_at`)."""
    rows = session.execute(
        select(RequestOutcome.prompt, RequestOutcome.messages, RequestOutcome.output_tokens,
               RequestOutcome.max_tokens, RequestOutcome.finished_at)
        .where(RequestOutcome.model_name == model_name, RequestOutcome.output_tokens > 0)
        .order_by(RequestOutcome.finished_at.desc())
        .limit(limit)
    ).all()
    return [{"prompt": messages or prompt, "model": model_name, "output_tokens": tokens,
             "max_tokens": max_tokens, "finished_at": finished_at}
            for prompt, messages, tokens, max_tokens, finished_at in reversed(rows)]


def step_samples(session: Session, instance_id: str, *, limit: int) -> list[dict[str, float]]:
    """The latest `limit` step samples of an instance, oldest first, in the fitting format
    (context features included: 0 in rows recorded without them)."""
    rows = session.scalars(
        select(EngineStepSample).where(EngineStepSample.instance_id == instance_id)
        .order_by(EngineStepSample.at.desc(), EngineStepSample.id.desc()).limit(limit)
    ).all()
    return [{"duration_ms": r.duration_ms, "num_seqs": r.num_seqs,
             "num_prefill_tokens": r.num_prefill_tokens, "num_decode_tokens": r.num_decode_tokens,
             "decode_context_tokens": r.decode_context_tokens,
             "prefill_chunk_x_context": r.prefill_chunk_x_context,
             "prefill_chunk_sq": r.prefill_chunk_sq}
            for r in reversed(rows)]
