"""The predict stage: a request's predicted output length, recorded before it is routed.

`start` marks the request predicting and reads what the predictor needs, `record` stores the
answer; in between the configured length predictor answers. The learned one runs concurrent
task threads' queries through one micro-batcher (a burst is embedded in a few batched passes) and
scales every answer by the bias watch's correction. No database connection is held while a model
runs.

The learned predictor has a head by path (`HEAD_FAST`, `HEAD_ACCURATE`): routing barely uses
output-length accuracy (routing with the mean length comes close to routing with the learned
one) while MiniLM one prompt at a time costs the hot path twice the static head's CPU (figures:
docs/measurements.md), so interactive
requests get the fast head; batch lines, whose sums of lengths make a batch's completion time,
get the accurate one, batched (docs/benchmarks_length.md, "Heads by path").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from domain import model_registry, request_store
from domain.db import Database
from domain.models import InferenceRequest, Priority, RequestStatus, utcnow
from domain.slo import RequestTargets
from workers.active_model import ActiveModel
from workers.predict.baseline import RunningMeanPredictor
from workers.predict.batcher import MicroBatcher
from workers.predict.features import Prompt
from workers.predict.history import LengthHistory
from workers.predict.table import PredictionTable
from workers.registry import Registry
from workers.runtime import Runtime

if TYPE_CHECKING:
    from workers.predict.length_model import LengthPredictor

log = logging.getLogger(__name__)

__all__ = ["HEAD_ACCURATE", "HEAD_FAST", "LengthQuery", "LengthAnswer", "LENGTH_PREDICTOR_STAGES",
           "head_for", "length_predictor", "learned_lengths", "Started", "start",
           "prediction_columns", "record"]

#: The learned heads by path (`length_model.HEAD_PATHS`).
HEAD_FAST, HEAD_ACCURATE = "fast", "accurate"


@dataclass(frozen=True, slots=True)
class LengthQuery:
    """What the length predictor needs of one request."""

    prompt: Prompt
    max_tokens: int
    priority: int = 0  # Priority.rank: interactive (0) before batch (1) in the micro-batcher
    model: str = ""  # the served model it runs on ("": the configured default)


@dataclass(frozen=True, slots=True)
class LengthAnswer:
    tokens: int
    p90_tokens: int | None
    predictor: str  # the name that made it, recorded with the request


class LengthPredictorStage(Protocol):
    """One of `Settings.length_predictor`'s choices, built once per process from the runtime."""

    def __init__(self, rt: Runtime) -> None: ...

    def predict(self, query: LengthQuery) -> LengthAnswer: ...


LENGTH_PREDICTOR_STAGES: Registry[LengthPredictorStage] = Registry("length predictor")


@LENGTH_PREDICTOR_STAGES.register("baseline")
class BaselineLengths:
    """The running mean of the served model's observed lengths (kept in Redis)."""

    model = RunningMeanPredictor()

    def __init__(self, rt: Runtime) -> None:
        self.redis, self.default_model = rt.redis, rt.settings.default_model

    def predict(self, query: LengthQuery) -> LengthAnswer:
        history = LengthHistory(self.redis, model=query.model or self.default_model)
        tokens = self.model.predict(history.stats(), max_tokens=query.max_tokens)
        return LengthAnswer(tokens, None, self.model.name)


@LENGTH_PREDICTOR_STAGES.register("table")
class TableLengths:
    """Fixed predictions per prompt from Settings.length_predictions_path (workers/predict/table:
    a benchmark's oracle, mean or noise-model lengths), not scaled by the bias correction."""

    def __init__(self, rt: Runtime) -> None:
        path = rt.settings.length_predictions_path
        if path is None:
            raise ValueError("length_predictor 'table' needs length_predictions_path")
        self.table = PredictionTable.from_jsonl(path)

    def predict(self, query: LengthQuery) -> LengthAnswer:
        tokens, name = self.table.lookup(query.prompt, max_tokens=query.max_tokens)
        return LengthAnswer(tokens, None, name)


@LENGTH_PREDICTOR_STAGES.register("learned")
class LearnedLengths:
    """One path's learned head (`head`: `HEAD_FAST` or `HEAD_ACCURATE`).

    The accurate path answers with the registry's active length model of the served model
    (hot-reloaded; the online loop retrains it), else the configured or packaged MiniLM head;
    one encoder is loaded, versions swap only the head. The fast path answers with its
    configured or packaged static head, and takes a registry version only when it was trained
    on the same encoder (a MiniLM version would load torch into the API).

    A model that cannot load or run (a bad artifact, a missing encoder) must not stall the
    pipeline: the accurate path's queries are answered by the fast head, the fast path's by
    the baseline (labelled so), and the model is tried again after `retry_after_s`.
    """

    #: Seconds of fallback answers after the learned model failed, before it is tried again.
    retry_after_s: float = 60.0

    def __init__(self, rt: Runtime, head: str = HEAD_ACCURATE) -> None:
        if head not in (HEAD_FAST, HEAD_ACCURATE):
            raise ValueError(f"head must be {HEAD_FAST!r} or {HEAD_ACCURATE!r}, got {head!r}")
        self.rt, self.head = rt, head
        self._failed_at: float | None = None
        self.batcher: MicroBatcher[LengthQuery, LengthAnswer] = MicroBatcher(
            self._predict_batch, max_batch=32, name=f"length-batcher-{head}")

    @cached_property
    def packaged(self) -> LengthPredictor:
        """The path's configured or packaged model, encoder included: loaded once per
        process (`length_model.head_artifact`)."""
        # NOTE: torch and transformers load here, in predictor workers only, not at import.
        from workers.predict.length_model import LengthPredictor, head_artifact  # noqa: PLC0415

        s = self.rt.settings
        return LengthPredictor.load(head_artifact(self.head, accurate=s.length_model_path,
                                                  fast=s.length_fast_model_path),
                                    num_threads=1)

    @cached_property
    def active(self) -> ActiveModel[LengthPredictor]:
        s = self.rt.settings
        return ActiveModel(
            self.rt.db, model_registry.KIND_LENGTH, s.model_name, load=self._with_version,
            default=lambda: self.packaged, interval_s=s.model_reload_interval_s)

    def _with_version(self, artifact: bytes) -> LengthPredictor:
        """The packaged model with a registry version's head; on the fast path, only a
        version trained on the fast head's own encoder."""
        from workers.predict.length_model import LengthHead  # noqa: PLC0415

        head = LengthHead.from_bytes(artifact)
        if self.head == HEAD_FAST and head.encoder.get("name") != self.packaged.encoder.name:
            return self.packaged
        return self.packaged.with_head(head)

    def predict(self, query: LengthQuery) -> LengthAnswer:
        return self.batcher(query, priority=query.priority)

    @cached_property
    def fallback(self) -> BaselineLengths:
        return BaselineLengths(self.rt)

    def _predict_batch(self, queries: Sequence[LengthQuery]) -> list[LengthAnswer]:
        if self._failed_at is not None and time.monotonic() - self._failed_at < self.retry_after_s:
            return self._fallback_batch(queries)
        try:
            answers = self._predict_learned(queries)
        except Exception:  # noqa: BLE001 - any failure of the model: the fallback answers
            log.exception("%s length head unavailable; its fallback answers for %.0f s",
                          self.head, self.retry_after_s)
            self._failed_at = time.monotonic()
            return self._fallback_batch(queries)
        self._failed_at = None
        return answers

    def _fallback_batch(self, queries: Sequence[LengthQuery]) -> list[LengthAnswer]:
        """The accurate path's: the fast head (itself falling back to the baseline); the fast
        path's: the baseline."""
        if self.head == HEAD_ACCURATE:
            return learned_lengths(self.rt, HEAD_FAST)._predict_batch(queries)
        return [self.fallback.predict(q) for q in queries]

    def predict_many(self, queries: Sequence[LengthQuery]) -> list[LengthAnswer]:
        """Many queries at once, in order, outside the micro-batcher (a batch's lines for its
        completion estimate: one call, the encoder's passes batched)."""
        return self._predict_batch(queries) if queries else []

    def _predict_learned(self, queries: Sequence[LengthQuery]) -> list[LengthAnswer]:
        """Each query for its own served model, in one pass over the batch."""
        predictor = self.active.get()
        default = self.rt.settings.default_model
        names = [q.model or default for q in queries]
        # One pass over the whole batch, each row for its own model (a model the artifact never
        # saw is predicted zero-shot: the population's model effect).
        predictions = predictor.predict_batch([q.prompt for q in queries], names,
                                              [q.max_tokens for q in queries])
        factors = {name: self.rt.bias_watch.correction(name) for name in set(names)}
        return [LengthAnswer(_scaled(p.tokens, factors[name], q.max_tokens),
                             _scaled(p.p90_tokens, factors[name], q.max_tokens), predictor.name)
                for p, q, name in zip(predictions, queries, names, strict=True)]


def length_predictor(rt: Runtime, head: str = HEAD_ACCURATE) -> LengthPredictorStage:
    """The process's configured length predictor; a learned one, the head of path `head`
    (`head_for` a query). The baseline and table predictors answer every path alike."""
    if rt.settings.length_predictor == "learned":
        return learned_lengths(rt, head)  # one per path, the accurate one shared with learning
    return rt.component(_build_length_predictor)


def head_for(query: LengthQuery) -> str:
    """The path of a query: interactive requests are on the hot path (the fast head), batch
    lines are bulk work (the accurate head)."""
    return HEAD_FAST if query.priority == Priority.INTERACTIVE.rank else HEAD_ACCURATE


def learned_lengths(rt: Runtime, head: str = HEAD_ACCURATE) -> LearnedLengths:
    """The process's learned length predictor of path `head` (the online loop retrains the
    accurate one's active model)."""
    return rt.component(_fast_lengths if head == HEAD_FAST else LearnedLengths)


def _fast_lengths(rt: Runtime) -> LearnedLengths:
    return LearnedLengths(rt, HEAD_FAST)


def _build_length_predictor(rt: Runtime) -> LengthPredictorStage:
    return LENGTH_PREDICTOR_STAGES.create(rt.settings.length_predictor, rt)


@dataclass(frozen=True, slots=True)
class Started:
    """A request the predict stage took: its length query, and what routing it needs."""

    query: LengthQuery
    num_prompt_tokens: int
    attempt: int
    targets: RequestTargets | None = None  # its latency targets, for the router
    # The prompt as the engine gets it, for prefix-cache-aware routing: its text, and its
    # token ids when the client gave ids.
    prompt: str = ""
    prompt_token_ids: list[int] | None = None
    session_key: str | None = None  # its session, for session affinity (domain/sessions.py)


def start(db: Database, request_id: str) -> Started | None:
    """Mark the request predicting and return its query, or None when it is past this stage.

    A redelivered task finds it already predicting and predicts again (nothing was routed yet).
    """
    with db.session() as session:
        # NOTE: the columns come back from the UPDATE itself (no second read, no ORM object);
        # only a redelivery, which finds the request already predicting, reads them. This mark
        # need not survive a database crash, so its commit does not wait for the WAL flush:
        # lost, the request is queued again, and its predict message, unacknowledged until
        # this task ends, is delivered again.
        request = request_store.transition_returning(
            session, request_id, RequestStatus.PREDICTING, allowed_from={RequestStatus.QUEUED},
            returning=_STARTED_COLUMNS, wait_for_wal=False)
        if request is None:
            request = session.execute(
                select(*_STARTED_COLUMNS).where(
                    InferenceRequest.id == request_id,
                    InferenceRequest.status == str(RequestStatus.PREDICTING))).first()
        return None if request is None else started_of(request)


def started_of(request: Any) -> Started:
    """What the stage needs of a request: a row of `_STARTED_COLUMNS`, or an
    `InferenceRequest` (the API routing a request it has just stored)."""
    query = LengthQuery(request.messages or request.prompt, request.max_tokens,
                        Priority(request.priority).rank, request.model or "")
    return Started(query, request.prompt_tokens, request.attempt, RequestTargets.of(
        request.slo_ttft_ms, request.slo_e2e_ms, request.slo_miss_action,
        request.created_at), request.prompt, request.prompt_token_ids, request.session_key)


#: What `start` reads of a request.
_STARTED_COLUMNS = (InferenceRequest.messages, InferenceRequest.prompt,
                    InferenceRequest.max_tokens, InferenceRequest.priority,
                    InferenceRequest.prompt_tokens, InferenceRequest.attempt,
                    InferenceRequest.slo_ttft_ms, InferenceRequest.slo_e2e_ms,
                    InferenceRequest.slo_miss_action, InferenceRequest.created_at,
                    InferenceRequest.prompt_token_ids, InferenceRequest.session_key,
                    InferenceRequest.model)


def prediction_columns(answer: LengthAnswer) -> dict[str, Any]:
    """The request's columns that keep a prediction."""
    return {"predicted_output_tokens": answer.tokens,
            "predicted_output_tokens_p90": answer.p90_tokens, "predictor": answer.predictor,
            "predicted_at": utcnow()}


def record(session: Session, request_id: str, answer: LengthAnswer) -> bool:
    """Store the answer; False when the request left `predicting` meanwhile (cancelled)."""
    recorded = session.execute(
        update(InferenceRequest)
        .where(InferenceRequest.id == request_id,
               InferenceRequest.status == str(RequestStatus.PREDICTING))
        .values(**prediction_columns(answer))
        .execution_options(synchronize_session=False)
    ).rowcount  # type: ignore[attr-defined]
    return recorded == 1


def _scaled(tokens: int, factor: float, cap: int) -> int:
    return max(1, min(cap, round(tokens * factor)))
