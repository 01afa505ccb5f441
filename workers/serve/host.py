"""The engine host: one engine per engine-worker process, fed by many Celery tasks at once.

Each `serve.generate` task runs in a thread of the worker's thread pool and blocks on its
request's future while the engine batches every in-flight request together (continuous batching
survives Celery because the pool is wider than the engine's max_num_seqs). Beside the engine run
two threads: one publishes the instance state and heartbeat to Redis and applies cancellations,
the other writes buffered step samples to the database.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import redis
from sqlalchemy import insert, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from app import dispatch, metrics, store
from app.models import (
    EngineStepSample,
    InferenceRequest,
    Instance,
    Priority,
    RequestStatus,
    utcnow,
)
from app.streams import StreamWriter
from workers.learn import history
from workers.predict.history import LengthHistory
from workers.runtime import Runtime, current_celery
from workers.serve.engine import (
    Engine,
    EngineListener,
    GenerationRequest,
    GenerationResult,
    StepSample,
)

__all__ = ["EngineHost"]

logger = logging.getLogger(__name__)


def _at(unix_s: float | None) -> datetime | None:
    return None if unix_s is None else datetime.fromtimestamp(unix_s, UTC)


class EngineHost(EngineListener):
    """Owns the engine of one instance and everything it reports (it is the engine's listener)."""

    def __init__(
        self, instance_id: str, make_engine: Callable[[EngineListener], Engine], runtime: Runtime
    ) -> None:
        self.instance_id = instance_id
        self.engine = make_engine(self)
        self.rt = runtime
        self._step_metrics = metrics.EngineStepMetrics(instance_id, runtime.settings.engine_kind)
        self.streams = StreamWriter(runtime.redis)
        self._samples: deque[StepSample] = deque(maxlen=100_000)
        self._stop = threading.Event()
        self._accepting = True
        self._threads: list[threading.Thread] = []

    @property
    def model_name(self) -> str:
        return self.rt.settings.model_name

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self.engine.start()
        self.streams.start()
        self._register()
        self._publish_once()
        for target, name in ((self._publish_loop, "publisher"), (self._flush_loop, "samples")):
            thread = threading.Thread(target=target, name=f"{self.instance_id}-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        logger.info("engine host %s ready", self.instance_id)

    def withdraw(self) -> None:
        """Stop taking new work (warm shutdown begins): routers stop choosing this instance at
        once, while the heartbeat goes on so that the work it is finishing is not re-routed."""
        self._accepting = False
        self._publish_once()

    def stop(self) -> None:
        """Once the pool has drained: stop publishing; whatever is left here gets re-routed."""
        self._accepting = False
        self._stop.set()
        self.rt.fleet.mark_stopped(self.instance_id)
        for thread in self._threads:
            thread.join(timeout=5)
        self._flush_samples()
        self.engine.stop()
        self.streams.stop()

    def on_step(self, sample: StepSample) -> None:
        self._samples.append(sample)
        self._step_metrics.observe(sample)

    def on_tokens(self, request_id: str, delta_text: str) -> None:
        # Streamed text is what the row will store (NUL made storable), byte for byte.
        self.streams.add(request_id, _storable(delta_text))

    # --- one request ---------------------------------------------------------------------------
    def run(self, request_id: str, attempt: int) -> None:
        """Generate one request if it is still ours to run, and write its completion once."""
        try:
            self._run(request_id, attempt)
        finally:
            # Whatever happened, this request no longer waits to be admitted here.
            self.rt.fleet.unassign(self.instance_id, request_id)

    def _run(self, request_id: str, attempt: int) -> None:
        generation = self._admit(request_id, attempt)
        if generation is None:
            return
        try:
            result = self.engine.submit(generation).result()
        except Exception as exc:
            if self._stop.is_set():
                raise  # shutting down: leave the message unacknowledged for a retry
            self._fail(request_id, attempt, exc)
            return
        if result.finish_reason == "abort":
            self.streams.discard(request_id)
            return  # cancelled: the cancel already wrote the terminal status
        try:
            self._complete(result, attempt)
        except (OperationalError, redis.ConnectionError):
            raise  # transient: the task retries, and the engine returns the same result
        except Exception as exc:  # noqa: BLE001 - anything else must not strand the request
            self._fail(request_id, attempt, exc)

    def _admit(self, request_id: str, attempt: int) -> GenerationRequest | None:
        ours = [
            InferenceRequest.instance_id == self.instance_id,
            InferenceRequest.attempt == attempt,
        ]
        with self.rt.db.session() as session:
            store.transition(
                session,
                request_id,
                RequestStatus.RUNNING,
                allowed_from={RequestStatus.ROUTED},
                extra_where=ours,
                detail=f"admitted by {self.instance_id}",
                started_at=utcnow(),
            )
            request = session.get(InferenceRequest, request_id)
            if (
                request is None
                or request.status != RequestStatus.RUNNING
                or request.instance_id != self.instance_id
                or request.attempt != attempt
            ):
                return None  # finished, cancelled, or re-routed since this message was sent
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
            )

    def _complete(self, result: GenerationResult, attempt: int) -> None:
        with self.rt.db.session() as session:
            done = store.transition(
                session,
                result.request_id,
                RequestStatus.SUCCEEDED,
                allowed_from=store.ACTIVE_STATUSES,
                detail=f"finished on {self.instance_id}",
                output_text=_storable(result.output_text),
                output_tokens=result.num_output_tokens,
                finish_reason=result.finish_reason,
                first_token_at=_at(result.first_token_at),
                finished_at=_at(result.finished_at),
            )
            if done:
                history.record_outcome(session, result.request_id, model_name=self.model_name)
                predicted = session.scalar(select(InferenceRequest.predicted_output_tokens)
                                           .where(InferenceRequest.id == result.request_id))
                finished = session.get(InferenceRequest, result.request_id)
            webhook_url = done and _webhook_url(session, result.request_id)
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
        self._learn_from(predicted, result.num_output_tokens)
        if webhook_url:
            dispatch.enqueue_webhook(current_celery(), result.request_id, "request.succeeded")

    def _learn_from(self, predicted: int | None, actual: int) -> None:
        """Feed the baseline's running mean and the bias watch; a new fallback asks for a
        retrain of the length model."""
        LengthHistory(self.rt.redis, model=self.model_name).observe(actual)
        if predicted is None or not self.rt.bias_watch.observe(self.model_name, predicted,
                                                               actual):
            return
        logger.warning("length predictions keep missing: routing falls back to round_robin")
        dispatch.enqueue_retrain(current_celery(), reason="bias watch")

    def _fail(self, request_id: str, attempt: int, exc: Exception) -> None:
        logger.exception("generation failed for %s", request_id)
        with self.rt.db.session() as session:
            done = store.transition(
                session,
                request_id,
                RequestStatus.FAILED,
                allowed_from=store.ACTIVE_STATUSES,
                detail=f"engine error on {self.instance_id}",
                error={"type": "engine_error", "message": f"{type(exc).__name__}: {exc}"},
                finished_at=utcnow(),
            )
            webhook_url = done and _webhook_url(session, request_id)
        if done:
            self.streams.fail(request_id, attempt, "the engine failed to generate this request")
        if webhook_url:
            dispatch.enqueue_webhook(current_celery(), request_id, "request.failed")

    # --- background threads --------------------------------------------------------------------
    def _publish_loop(self) -> None:
        interval = self.rt.settings.state_publish_interval_s
        while not self._stop.wait(interval):
            try:
                self._publish_once()
            except Exception:  # noqa: BLE001 - a Redis hiccup must not kill the publisher
                logger.exception("state publish failed on %s", self.instance_id)

    def _publish_once(self) -> None:
        snapshot = self.engine.snapshot()
        state: dict[str, Any] = dataclasses.asdict(snapshot)
        state["instance_id"] = self.instance_id
        state["model"] = self.model_name
        state["accepting"] = self._accepting
        self.rt.fleet.publish(self.instance_id, state)
        in_flight = [r.request_id for r in snapshot.requests]
        for request_id in self.rt.fleet.cancelled(in_flight):
            self.engine.abort(request_id)

    def _flush_loop(self) -> None:
        interval = self.rt.settings.step_sample_flush_s
        while not self._stop.wait(interval):
            try:
                self._flush_samples()
            except Exception:  # noqa: BLE001 - samples are best effort; requests are not
                logger.exception("step sample flush failed on %s", self.instance_id)

    def _flush_samples(self) -> None:
        batch = [self._samples.popleft() for _ in range(len(self._samples))]
        with self.rt.db.session() as session:
            if batch:
                session.execute(insert(EngineStepSample), [self._sample_row(s) for s in batch])
            instance = session.get(Instance, self.instance_id)
            if instance is not None:
                instance.last_seen_at = utcnow()

    def _sample_row(self, sample: StepSample) -> dict[str, Any]:
        row = dataclasses.asdict(sample)
        row["at"] = _at(sample.at)
        row["instance_id"] = self.instance_id
        return row

    def _register(self) -> None:
        snapshot = self.engine.snapshot()
        config = {
            "max_num_seqs": snapshot.max_num_seqs,
            "max_num_batched_tokens": snapshot.max_num_batched_tokens,
            "block_size": snapshot.block_size,
            "max_model_len": snapshot.max_model_len,
            "num_total_blocks": snapshot.num_total_blocks,
        }
        now = utcnow()
        with self.rt.db.session() as session:
            session.merge(
                Instance(
                    id=self.instance_id,
                    engine_kind=snapshot.engine_kind,
                    model=self.model_name,
                    config=config,
                    started_at=now,
                    last_seen_at=now,
                )
            )


def _storable(text: str) -> str:
    """Text as every database stores it: PostgreSQL text cannot hold NUL characters."""
    return text.replace("\x00", "\ufffd")


def _webhook_url(session: Session, request_id: str) -> str | None:
    request = session.get(InferenceRequest, request_id)
    return request.webhook_url if request else None
