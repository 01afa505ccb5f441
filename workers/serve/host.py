"""The engine host: one engine per engine-worker process, fed by many Celery tasks at once.

Each `serve.generate` task runs in a thread of the worker's thread pool and blocks on its
request's future while the engine batches every in-flight request together (continuous batching
survives Celery because the pool is wider than the engine's max_num_seqs). The host wires the
parts that surround the engine, each with one job:

- `RequestRecords` (request_records.py): admit, complete and fail requests in the database;
- `StatePublisher` (publisher.py): a thread publishing the instance state and heartbeat to Redis
  and applying cancellations;
- `StepSampleSink` (step_samples.py): a thread writing buffered step samples to the database;
- `OwnershipCheck` (ownership.py): a thread aborting what the database no longer gives to this
  instance (cancelled, or re-routed while the instance could not be reached);
- `LengthFeedback` (feedback.py): what finished requests teach the length predictors.

The host itself is the engine's listener: it hands step samples and streamed text on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import redis
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as SqlTimeoutError

from domain import dispatch, metrics, served_models
from domain.models import Instance, utcnow
from domain.streams import StreamWriter
from workers.runtime import Runtime
from workers.serve.engine import (
    Engine,
    EngineListener,
    EngineStopped,
    GenerationResult,
    StepSample,
)
from workers.serve.feedback import LengthFeedback
from workers.serve.ownership import Attempts, OwnershipCheck
from workers.serve.publisher import StatePublisher
from workers.serve.request_records import RequestRecords
from workers.serve.step_samples import StepSampleSink
from workers.sim.engine_state import Declared

__all__ = ["EngineHost"]

logger = logging.getLogger(__name__)

#: How long a new attempt waits for the abort of an earlier one of the same request.
ABORT_WAIT_S = 30.0
#: How long stop() waits for a periodic thread's run in progress.
JOIN_TIMEOUT_S = 5.0


class EngineHost(EngineListener):
    """Owns the engine of one instance and the parts around it (it is the engine's listener)."""

    def __init__(
        self, instance_id: str, make_engine: Callable[[EngineListener], Engine], runtime: Runtime,
        declared: Declared | None = None,
    ) -> None:
        """`declared`: what the instance serves (default: the runtime's model, by name)."""
        self.instance_id = instance_id
        self.engine = make_engine(self)
        self.rt = runtime
        settings = runtime.settings
        self.declared = declared or Declared(model=settings.model_name)
        self._step_metrics = metrics.EngineStepMetrics(instance_id, settings.engine_kind,
                                                       model=self.model_name)
        self.streams = StreamWriter(runtime.redis,
                                    flush_interval_s=settings.stream_flush_interval_s)
        feedback = LengthFeedback(runtime.redis, runtime.bias_watch, self.model_name)
        self.records = RequestRecords(instance_id, self.model_name, runtime.outbox,
                                      self.streams, feedback)
        self.publisher = StatePublisher(instance_id, self.declared, self.engine,
                                        runtime.fleet, settings.state_publish_interval_s,
                                        on_room=self._release_held if settings.routing_hold
                                        else None)
        self.samples = StepSampleSink(instance_id, runtime.db, settings.step_sample_flush_s)
        self.attempts = Attempts()
        self.ownership = OwnershipCheck(instance_id, runtime.db, self.engine, self.attempts,
                                        settings.ownership_check_interval_s)
        self._stopping = threading.Event()

    @property
    def model_name(self) -> str:
        return self.declared.model

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        started = time.monotonic()
        self.engine.start()
        # NOTE: the cold start's model-load phase, which the autoscaler's report quotes.
        logger.info("engine %s loaded in %.2f s", self.instance_id, time.monotonic() - started)
        self.streams.start()
        self._register()
        self.publisher.start()
        self.samples.start()
        self.ownership.start()
        logger.info("engine host %s ready", self.instance_id)

    def withdraw(self) -> None:
        """Stop taking new work (warm shutdown begins): routers stop choosing this instance at
        once, while the heartbeat goes on so that the work it is finishing is not re-routed."""
        self.publisher.withdraw()

    def stop(self) -> None:
        """Once the pool has drained: stop publishing; whatever is left here gets re-routed."""
        self._stopping.set()
        self.publisher.signal_stop()
        self.samples.signal_stop()
        self.ownership.signal_stop()
        self.publisher.join()
        self.samples.join()
        self.ownership.join(JOIN_TIMEOUT_S)
        self.engine.stop()
        self.streams.stop()

    # --- engine listener -----------------------------------------------------------------------
    def on_step(self, sample: StepSample) -> None:
        self.samples.add(sample)
        self._step_metrics.observe(sample)

    def on_tokens(self, request_id: str, delta_text: str) -> None:
        # Streamed text is what the row will store, NUL included, byte for byte.
        self.streams.add(request_id, delta_text)

    # --- one request ---------------------------------------------------------------------------
    def run(self, request_id: str, attempt: int) -> None:
        """Generate one request if it is still ours to run, and write its completion once."""
        try:
            self._run(request_id, attempt)
        finally:
            # Whatever happened, this request no longer waits to be admitted here.
            self.rt.fleet.unassign(self.instance_id, request_id)

    def _run(self, request_id: str, attempt: int) -> None:
        generation = self.records.admit(request_id, attempt)
        if generation is None:
            return
        self._abort_other_attempt(request_id, attempt)
        future = self.attempts.launch(request_id, attempt,
                                      lambda: self.engine.submit(generation))
        try:
            result = self._result(request_id, attempt, future)
        finally:
            self.attempts.end(request_id, attempt)
        if result is None:
            return
        if result.finish_reason == "abort":
            # Cancelled (the cancel wrote the terminal status) or no longer ours (the new
            # attempt streams and writes): nothing to write here.
            self.streams.discard(request_id)
            return
        try:
            self.records.complete(result, attempt)
        except (OperationalError, SqlTimeoutError, redis.ConnectionError):
            raise  # transient: the task retries, and the engine returns the same result
        except Exception as exc:  # noqa: BLE001 - anything else must not strand the request
            self.records.fail(request_id, attempt, exc)

    def _result(self, request_id: str, attempt: int, future: Future[GenerationResult]
                ) -> GenerationResult | None:
        """The engine's result; None when there is nothing to write (the engine died)."""
        try:
            return future.result()
        except EngineStopped:
            if self._stopping.is_set():
                raise  # shutting down: leave the message unacknowledged for a retry
            # NOTE: the engine died under this worker. The request is not failed: with the
            # heartbeat dropped (StatePublisher) the orphan sweep routes it elsewhere.
            logger.error("engine of %s stopped; %s left for re-routing", self.instance_id,
                         request_id)
            self.publisher.publish_once()
            return None
        except Exception as exc:
            if self._stopping.is_set():
                raise  # shutting down: leave the message unacknowledged for a retry
            self.records.fail(request_id, attempt, exc)
            return None

    def _abort_other_attempt(self, request_id: str, attempt: int) -> None:
        """A request re-routed back here while its earlier attempt still runs: the engine knows
        requests by id, so the earlier one is aborted, and waited for, first."""
        earlier = self.attempts.other_attempt(request_id, attempt)
        if earlier is None:
            return
        self.engine.abort(request_id)  # NOTE: no attempt of ours is in the engine yet
        try:
            earlier.result(timeout=ABORT_WAIT_S)
        except Exception:  # noqa: BLE001 - it ended one way or another; only the wait matters
            pass

    def _release_held(self) -> None:
        """The router holds requests and this instance has room: ask for a release. A plain
        send: if it is lost, the next publication with room sends another."""
        dispatch.release_held().send(self.rt.celery, retry=False)

    def _register(self) -> None:
        """Record the instance and its engine's config in the database, and its model among
        those ever served."""
        snapshot = self.engine.snapshot()
        config = {
            "model_path": self.declared.model_path,
            "hardware": self.declared.hardware,
            "exec_model": self.declared.exec_model,
            "capacity_rps": self.declared.capacity_rps,
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
            served_models.declare(session, self.declared.model, self.declared.model_path)
