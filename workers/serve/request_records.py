"""A request's life on an engine instance, in the database: admitted (ROUTED -> RUNNING),
completed (-> SUCCEEDED) or failed (-> FAILED), each written once, with the request's stream,
webhook, metrics and learning feedback following the write."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from domain import dispatch, metrics, request_store, slo
from domain.models import InferenceRequest, Priority, RequestStatus, utcnow
from domain.outbox import Outbox
from domain.streams import StreamWriter
from workers.learn import history
from workers.serve.engine import GenerationRequest, GenerationResult, SamplingOptions
from workers.serve.feedback import LengthFeedback

__all__ = ["RequestRecords"]

logger = logging.getLogger(__name__)


class RequestRecords:
    """Guarded status writes of the requests one instance runs: a write that finds the request
    finished, cancelled or re-routed meanwhile changes nothing, so a rerun is a no-op."""

    def __init__(self, instance_id: str, model_name: str, outbox: Outbox, streams: StreamWriter,
                 feedback: LengthFeedback) -> None:
        self.instance_id = instance_id
        self.model_name = model_name
        self.outbox = outbox
        self.db = outbox.db
        self.streams = streams
        self.feedback = feedback

    def admit(self, request_id: str, attempt: int) -> GenerationRequest | None:
        """Mark the request RUNNING here; None if it is no longer ours to run (finished,
        cancelled, or re-routed since this message was sent)."""
        with self.db.session() as session:
            # NOTE: the columns come back from the UPDATE itself (no second read, no ORM
            # object); only a redelivery, which finds the request already running, reads them.
            # Its commit does not wait for the WAL flush (the NOTE below `complete`).
            request = request_store.transition_returning(
                session,
                request_id,
                RequestStatus.RUNNING,
                allowed_from={RequestStatus.ROUTED},
                extra_where=self._ours(attempt),
                detail=f"admitted by {self.instance_id}",
                started_at=utcnow(),
                returning=_ADMIT_COLUMNS,
                wait_for_wal=False,
            )
            if request is None:
                request = session.execute(
                    select(*_ADMIT_COLUMNS).where(
                        InferenceRequest.id == request_id,
                        InferenceRequest.status == str(RequestStatus.RUNNING),
                        *self._ours(attempt))).first()
            if request is None:
                return None
            if request.stream:
                self.streams.follow(request_id, attempt)
            return GenerationRequest(
                request_id=request.id,
                prompt=request.prompt,
                max_tokens=request.max_tokens,
                temperature=request.temperature,
                top_p=request.top_p,
                seed=request.seed,
                stop=tuple(request.stop or ()),
                priority=Priority(request.priority).rank,
                predicted_output_tokens=request.predicted_output_tokens,
                sampling=SamplingOptions.from_column(request.sampling),
                prompt_token_ids=(tuple(request.prompt_token_ids)
                                  if request.prompt_token_ids is not None else None),
            )

    def _ours(self, attempt: int) -> list[Any]:
        """Where a write of this attempt applies: the request is still routed here, as this
        attempt. A stale attempt (the request was re-routed since) must not finish or fail a
        request that another instance runs now."""
        return [InferenceRequest.instance_id == self.instance_id,
                InferenceRequest.attempt == attempt]

    def complete(self, result: GenerationResult, attempt: int) -> None:
        """Store the result (SUCCEEDED) unless another attempt or a cancel came first."""
        with self.outbox.transaction() as tx:
            session = tx.session
            done = request_store.transition(
                session,
                result.request_id,
                RequestStatus.SUCCEEDED,
                allowed_from=request_store.ACTIVE_STATUSES,
                extra_where=self._ours(attempt),
                detail=f"finished on {self.instance_id}",
                output_text=result.output_text,  # NUL included (domain.models.ExactText)
                output_tokens=result.num_output_tokens,
                finish_reason=result.finish_reason,
                logprobs=result.logprobs,
                first_token_at=_utc(result.first_token_at),
                finished_at=_utc(result.finished_at),
            )
            if done:
                # NOTE: one read of the completed row (the history's); the lookups after it
                # come from the session's identity map, not the database.
                history.record_outcome(session, result.request_id, model_name=self.model_name)
                finished = session.get(InferenceRequest, result.request_id)
                predicted = finished.predicted_output_tokens if finished is not None else None
                if finished is not None:
                    _record_targets_met(finished)
                if finished is not None and finished.webhook_url:
                    tx.post(dispatch.webhook(result.request_id, "request.succeeded"))
        if not done:
            self.streams.discard(result.request_id)
            return  # completed by another attempt, or cancelled meanwhile
        logger.info("request finished on %s: %d tokens (%s)", self.instance_id,
                    result.num_output_tokens, result.finish_reason,
                    extra={"instance_id": self.instance_id,
                           "output_tokens": result.num_output_tokens,
                           "finish_reason": result.finish_reason})
        metrics.observe_completion(finished)
        self.streams.end(result.request_id, attempt, result.finish_reason)
        # NOTE: a crash is not a prediction error: a request that ran again after its instance
        # was lost (or it was moved, attempt > 1) teaches the bias watch nothing; its length
        # still feeds the running mean.
        self.feedback.observe(predicted if attempt <= 1 else None, result.num_output_tokens)

    def fail(self, request_id: str, attempt: int, exc: Exception) -> None:
        """Mark the request FAILED with the engine's error (logged with its traceback), unless it
        finished, was cancelled or was re-routed meanwhile."""
        logger.exception("generation failed for %s", request_id)
        with self.outbox.transaction() as tx:
            done = request_store.transition(
                tx.session,
                request_id,
                RequestStatus.FAILED,
                allowed_from=request_store.ACTIVE_STATUSES,
                extra_where=self._ours(attempt),
                detail=f"engine error on {self.instance_id}",
                error={"type": "engine_error", "message": f"{type(exc).__name__}: {exc}"},
                finished_at=utcnow(),
            )
            if done and _webhook_url(tx.session, request_id):
                tx.post(dispatch.webhook(request_id, "request.failed"))
        if done:
            self.streams.fail(request_id, attempt, "the engine failed to generate this request")


#: What `admit` reads of a request: what the engine needs to generate it.
_ADMIT_COLUMNS = (InferenceRequest.id, InferenceRequest.prompt, InferenceRequest.max_tokens,
                  InferenceRequest.temperature, InferenceRequest.top_p, InferenceRequest.seed,
                  InferenceRequest.stop, InferenceRequest.priority,
                  InferenceRequest.predicted_output_tokens, InferenceRequest.sampling,
                  InferenceRequest.prompt_token_ids, InferenceRequest.stream)


def _record_targets_met(request: InferenceRequest) -> None:
    """Whether the request met its latency targets (written with the completion's commit)."""
    if request.slo_ttft_ms is None and request.slo_e2e_ms is None:
        return
    request.slo_ttft_met, request.slo_e2e_met = slo.outcome(
        request.slo_ttft_ms, request.slo_e2e_ms, request.created_at, request.first_token_at,
        request.finished_at)


# NOTE (the admission's asynchronous commit, `wait_for_wal=False`): the commit does not wait for its
# WAL flush, a wait that lies on every request's path to its first token (milliseconds on a busy
# disk: docs/measurements.md). Only a crash of the database server itself can lose such a commit,
# never an application crash, and commits stay in order. For the admission that is safe: a request
# whose RUNNING mark is lost is ROUTED to this instance again, which the completion write accepts as
# it accepts RUNNING (the attempt guard decides), and which the sweep leaves alone while this
# instance publishes that it holds the request. The completion, which the client is told of, keeps
# the durable commit.


def _utc(unix_s: float | None) -> datetime | None:
    return None if unix_s is None else datetime.fromtimestamp(unix_s, UTC)


def _webhook_url(session: Session, request_id: str) -> str | None:
    request = session.get(InferenceRequest, request_id)
    return request.webhook_url if request else None
