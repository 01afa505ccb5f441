"""Batch completion estimates, kept up to date: when a batch is validated and again as it runs.

This module gathers what `workers/batch/eta.py` needs (the batch's remaining lines with their
predicted lengths from the accurate head, batched; the fleet its model runs on; the recent
interactive load it yields to; its model's share of the releaser's window and the releaser's
rounds) and stores the answer in Redis (`domain.batches.BATCH_ETA_KEY`), where the Batch
object, `blockq batch status` and /metrics read it.

NOTE: an estimate is derived data: lost with Redis, the next round (`batch_eta_interval_s`)
computes it again, so it needs no column.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import exists, func, or_, select
from sqlalchemy.orm import Session

from domain.batches import BATCH_ETA_KEY
from domain.models import (
    TERMINAL_STATUSES,
    Batch,
    BatchLine,
    BatchStatus,
    InferenceRequest,
    LineStatus,
    Priority,
    RequestStatus,
    utcnow,
)
from domain.request_store import ACTIVE_STATUSES
from domain.settings import Settings
from workers.batch import eta
from workers.batch.fair_share import pool_share
from workers.batch.headroom_window import current_window, pool_weights
from workers.predict import stage
from workers.runtime import Runtime
from workers.sim import InstanceConfig, exec_model_of

__all__ = ["EtaRecord", "active_models", "dispatch_delay", "estimate_batch", "eta_config",
           "fleet_of", "interactive_load", "refresh_estimates", "tokens_made",
           "window_share"]

logger = logging.getLogger(__name__)

#: Interactive requests created this recently give the load the batch yields to.
INTERACTIVE_WINDOW_S = 300.0
#: Recent interactive requests whose shapes the simulated stream draws from.
MAX_SHAPES = 500
#: Batch lines admitted this recently, at most `MAX_DISPATCHES` of them, give the pipeline's
#: delay from a line's release to its engine.
DISPATCH_WINDOW_S = 120.0
MAX_DISPATCHES = 200
#: Block size of an emulated engine that sets none (workers/serve/factory.py's default).
_DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class EtaRecord:
    """What the Batch object shows under "blockq"."""

    estimated_completion_at: int  # unix seconds
    estimated_at: int
    meets_completion_window: bool
    remaining_lines: int
    lines_per_s: float | None

    def to_json(self) -> str:
        return json.dumps({name: getattr(self, name) for name in self.__slots__})


def fleet_of(settings: Settings, model: str | None) -> list[eta.EtaInstance]:
    """The configured instances serving `model` (all of them when it is None or none
    serves it), each with its scheduler settings and execution-time model."""
    ids = settings.instance_ids
    members = [settings.for_instance(i) for i in ids]
    serving = [m for m in members if model is None or m.model_name == model] or members
    return [eta.EtaInstance(InstanceConfig(
        num_total_blocks=m.emulated_num_blocks, block_size=m.block_size or _DEFAULT_BLOCK_SIZE,
        max_num_seqs=m.max_num_seqs, max_num_batched_tokens=m.max_num_batched_tokens,
        max_model_len=m.max_model_len), exec_model_of(m.emulated_exec_model))
        for m in serving]


def estimate_batch(rt: Runtime, batch_id: str, *, now: datetime | None = None) -> EtaRecord | None:
    """Estimate `batch_id`'s completion now and store it; None when it is not running."""
    now = now or utcnow()
    s = rt.settings
    with rt.db.session() as session:
        batch = session.get(Batch, batch_id)
        # NOTE: not while validating: its lines are still being read in, and an estimate of
        # the first chunks said "done in 1 s" for a batch of 2,000 lines.
        if batch is None or batch.status != BatchStatus.IN_PROGRESS:
            return None
        model, expires_at = batch.model, batch.expires_at
        made = tokens_made(rt, model)
        queries, num_remaining = _remaining(session, batch_id, s.batch_eta_max_lines, made)
        interactive = interactive_load(session, now, model)
        ratio = _calibration(session, batch_id)
        models = active_models(session)
        delay_s = dispatch_delay(session, now)
    lines = _predicted_lines(rt, queries, ratio)
    share = window_share(current_window(rt), model, models, pool_weights(rt.fleet))
    answer = eta.estimate(lines, fleet_of(s, model), interactive, eta_config(s, share, delay_s),
                          num_lines=num_remaining)
    wall_s = answer.seconds * _time_scale(s)
    done_at = now + timedelta(seconds=wall_s)
    record = EtaRecord(
        estimated_completion_at=int(math.ceil(done_at.timestamp())),
        estimated_at=int(now.timestamp()),
        meets_completion_window=not answer.capped and done_at <= expires_at,
        remaining_lines=num_remaining,
        lines_per_s=None if not wall_s else round(num_remaining / wall_s, 3))
    rt.redis.hset(BATCH_ETA_KEY, batch_id, record.to_json())
    return record


def eta_config(settings: Settings, max_in_flight: int, dispatch_delay_s: float = 0.0
               ) -> eta.EtaConfig:
    """The simulation's settings for a live batch: `max_in_flight` its share of the releaser's
    window (`window_share`); the releaser's rounds and the pipeline's delay from a line's
    release to its engine (`dispatch_delay`, wall seconds), in the simulation's seconds."""
    scale = _time_scale(settings)
    return eta.EtaConfig(
        max_in_flight=max(1, max_in_flight), max_lines=settings.batch_eta_max_lines,
        release_interval_s=settings.batch_release_interval_s / scale,
        dispatch_delay_s=dispatch_delay_s / scale)


def dispatch_delay(session: Session, now: datetime) -> float:
    """Wall seconds from a batch line's release to its engine's admission (created to started,
    through the predict and route workers), the median of the lines admitted over the last
    `DISPATCH_WINDOW_S`; 0 with none.

    NOTE: a released line holds its slot in the window from its release but its seat only from
    its admission, so a freed seat idles this long on top of the wait for the releaser's next
    round (small beside a line's seconds on the live benchmark's fleet: docs/batch_eta.md).
    """
    since = now - timedelta(seconds=DISPATCH_WINDOW_S)
    rows = session.execute(
        select(InferenceRequest.created_at, InferenceRequest.started_at)
        .where(InferenceRequest.priority == str(Priority.BATCH),
               InferenceRequest.started_at >= since, InferenceRequest.started_at <= now)
        .order_by(InferenceRequest.started_at.desc()).limit(MAX_DISPATCHES)).all()
    delays = [(started - created).total_seconds() for created, started in rows]
    return max(0.0, statistics.median(delays)) if delays else 0.0


def _time_scale(settings: Settings) -> float:
    """Wall seconds per simulated second: an emulated fleet runs `emulated_time_scale` wall
    seconds per emulated one."""
    return settings.emulated_time_scale if settings.engine_kind == "emulated" else 1.0


def window_share(window: int, model: str | None, models: Iterable[str],
                 weights: Mapping[str, float]) -> int:
    """The slots of the releaser's `window` that `model`'s batches get while the batches of
    `models` run too: its pool's share by `weights` (`fair_share.pool_share`), at least 1.

    NOTE: the window is shared between the models' pools, not given to each: two models of
    equal seats under a window of 192 run 96 lines each, and an estimate that gave each batch
    all 192 came out short (issue 43's live benchmark).
    """
    return max(1, round(window * pool_share(model or "", models, weights)))


def active_models(session: Session) -> set[str]:
    """The models of the batches in progress with lines pending or in flight: the pools the
    releaser shares its window among now."""
    pending = exists().where(BatchLine.batch_id == Batch.id,
                             BatchLine.status == LineStatus.PENDING)
    in_flight = exists().where(InferenceRequest.batch_id == Batch.id,
                               InferenceRequest.status.in_([str(s) for s in ACTIVE_STATUSES]))
    rows = session.scalars(select(Batch.model).distinct().where(
        Batch.status == BatchStatus.IN_PROGRESS, or_(pending, in_flight)))
    return {model or "" for model in rows}


def refresh_estimates(rt: Runtime) -> dict[str, EtaRecord]:
    """Estimate every running batch again and forget the estimates of batches that stopped;
    a batch that will miss its completion window is logged."""
    with rt.db.session() as session:
        running = set(session.scalars(select(Batch.id).where(
            Batch.status == BatchStatus.IN_PROGRESS)))
    stale = [bid.decode() if isinstance(bid, bytes) else bid
             for bid in rt.redis.hkeys(BATCH_ETA_KEY)]
    gone = [bid for bid in stale if bid not in running]
    if gone:
        rt.redis.hdel(BATCH_ETA_KEY, *gone)
    records = {}
    for batch_id in sorted(running):
        record = estimate_batch(rt, batch_id)
        if record is not None:
            records[batch_id] = record
            if not record.meets_completion_window:
                logger.warning("batch %s is estimated to finish after its completion window "
                               "(at %d, %d lines left)", batch_id,
                               record.estimated_completion_at, record.remaining_lines)
    return records


# -- inputs -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Remaining:
    """A line still to run: its length query, prompt tokens, and output tokens already made
    (a released line) or a length already predicted."""

    query: stage.LengthQuery
    prompt_tokens: int
    generated: int = 0
    predicted: int | None = None
    predicted_p90: int | None = None


def _remaining(session: Session, batch_id: str, most: int,
               made: Mapping[str, int]) -> tuple[list[_Remaining], int]:
    """A sample of at most about `most` of the batch's unfinished lines (every k-th pending
    line, every k-th unfinished request, with the tokens it has made: `made` by request id),
    and how many there are in all."""
    pending_n = session.scalar(select(func.count()).select_from(BatchLine).where(
        BatchLine.batch_id == batch_id, BatchLine.status == LineStatus.PENDING)) or 0
    unfinished = (InferenceRequest.batch_id == batch_id,
                  InferenceRequest.status.not_in([str(s) for s in TERMINAL_STATUSES]))
    running_n = session.scalar(select(func.count()).select_from(InferenceRequest)
                               .where(*unfinished)) or 0
    total = pending_n + running_n
    every = max(1, math.ceil(total / most))
    pending = session.execute(
        select(BatchLine.fields).where(BatchLine.batch_id == batch_id,
                                       BatchLine.status == LineStatus.PENDING,
                                       BatchLine.line % every == 0)
        .order_by(BatchLine.line)).scalars().all()
    running = session.execute(
        select(InferenceRequest.id, InferenceRequest.prompt, InferenceRequest.messages,
               InferenceRequest.max_tokens, InferenceRequest.model,
               InferenceRequest.prompt_tokens, InferenceRequest.predicted_output_tokens,
               InferenceRequest.predicted_output_tokens_p90)
        .where(*unfinished, InferenceRequest.batch_line % every == 0)).all()
    rows = [_Remaining(_query(f.get("messages") or f.get("prompt", ""), f.get("max_tokens"),
                              f.get("model")), int(f.get("prompt_tokens") or 1))
            for f in pending if f]
    rows += [_Remaining(_query(r.messages or r.prompt, r.max_tokens, r.model),
                        int(r.prompt_tokens or 1), made.get(r.id, 0),
                        r.predicted_output_tokens, r.predicted_output_tokens_p90)
             for r in running]
    return rows, total


def _query(prompt: Any, max_tokens: int | None, model: str | None) -> stage.LengthQuery:
    return stage.LengthQuery(prompt, int(max_tokens or 1), Priority.BATCH.rank, model or "")


#: Pending lines' predictions kept across rounds (a pending line is predicted again only when
#: the cache dropped it, or by a new head version): (head, prompt, model, max_tokens) -> answer,
#: oldest dropped first. NOTE: a kept answer keeps the bias correction of its round.
_ANSWERS: dict[tuple[str, str, str, int], stage.LengthAnswer] = {}
_MAX_ANSWERS = 50_000


def _calibration(session: Session, batch_id: str) -> float:
    """How much longer or shorter than predicted the batch's answers run, from its released
    lines in order (`eta.length_calibration`; a line that failed or was cancelled tells
    nothing and is passed over)."""
    r = InferenceRequest
    rows = session.execute(
        select(r.predicted_output_tokens, r.predicted_output_tokens_p90, r.max_tokens,
               r.status, r.output_tokens)
        .where(r.batch_id == batch_id).order_by(r.batch_line)).all()
    predicted: list[float] = []
    actual: list[int | None] = []
    for median, p90, cap, status, output in rows:
        done = status == RequestStatus.SUCCEEDED and median is not None and output is not None
        if status in TERMINAL_STATUSES and not done:
            continue
        predicted.append(eta.expected_tokens(median, p90, int(cap or 1_000_000))
                         if median is not None else 0.0)
        actual.append(int(output) if done else None)
    return eta.length_calibration(predicted, actual)


def tokens_made(rt: Runtime, model: str | None) -> dict[str, int]:
    """The output tokens each request in `model`'s engines has made so far, from their
    published states (every model's engines when None)."""
    made = {}
    for status in rt.fleet.statuses():
        state = status.state
        if state is None or (model is not None and status.model != model):
            continue
        for request in state.requests:
            made[request.request_id] = request.num_output_tokens
    return made


def _predicted_lines(rt: Runtime, remaining: Sequence[_Remaining],
                     ratio: float = 1.0) -> list[eta.EtaLine]:
    """Each line with its remaining output tokens: expected from the accurate head's median
    and p90, batched (a released line's own recorded prediction where it has one), scaled by
    the batch's `ratio` (`_calibration`), less what it generated already."""
    answers = iter(_answers(rt, [r.query for r in remaining if r.predicted is None]))
    lines = []
    for r in remaining:
        if r.predicted is not None:
            median, p90 = r.predicted, r.predicted_p90
        else:
            answer = next(answers)
            median, p90 = answer.tokens, answer.p90_tokens
        median, p90 = eta.calibrated(median, p90, ratio)
        tokens = eta.expected_tokens(median, p90, r.query.max_tokens, made=r.generated)
        lines.append(eta.EtaLine(r.prompt_tokens + r.generated, max(1, tokens - r.generated)))
    return lines


def _answers(rt: Runtime, queries: Sequence[stage.LengthQuery]) -> list[stage.LengthAnswer]:
    """The accurate head's answers, batched; the same pending lines are estimated every round,
    so answers are kept per head version."""
    predictor = stage.length_predictor(rt, stage.HEAD_ACCURATE)
    learned = isinstance(predictor, stage.LearnedLengths)
    head = _head_name(predictor) if learned else type(predictor).__name__
    keys = [(head, repr(q.prompt), q.model, q.max_tokens) for q in queries]
    first = {}
    for i, key in enumerate(keys):
        if key not in _ANSWERS:
            first.setdefault(key, i)
    if first:
        todo = [queries[i] for i in first.values()]
        fresh = predictor.predict_many(todo) if learned else [predictor.predict(q) for q in todo]
        _ANSWERS.update(zip(first, fresh, strict=True))
    found = [_ANSWERS[k] for k in keys]
    while len(_ANSWERS) > _MAX_ANSWERS:
        del _ANSWERS[next(iter(_ANSWERS))]
    return found


def _head_name(predictor: stage.LearnedLengths) -> str:
    """The active head's name; where it cannot load, a name no answer is kept under long
    (its fallback answers, labelled by their own predictor)."""
    try:
        return predictor.active.get().name
    except Exception:  # noqa: BLE001 - the predictor's own fallback answers below
        return f"unavailable@{time.monotonic():.0f}"


def interactive_load(session: Session, now: datetime,
                      model: str | None = None) -> eta.InteractiveLoad:
    """The interactive stream of the last `INTERACTIVE_WINDOW_S` to `model`'s instances (the
    batch's fleet; every model's when None): its rate, and the shapes of its latest requests
    (their actual output where they finished, else predicted)."""
    since = now - timedelta(seconds=INTERACTIVE_WINDOW_S)
    # NOTE: bounded on both sides: a benchmark asks about a moment already past.
    recent = (InferenceRequest.priority == str(Priority.INTERACTIVE),
              InferenceRequest.created_at >= since, InferenceRequest.created_at <= now,
              *((InferenceRequest.model == model,) if model is not None else ()))
    count = session.scalar(select(func.count()).select_from(InferenceRequest)
                           .where(*recent)) or 0
    if not count:
        return eta.InteractiveLoad()
    rows = session.execute(
        select(InferenceRequest.prompt_tokens,
               func.coalesce(InferenceRequest.output_tokens,
                             InferenceRequest.predicted_output_tokens,
                             InferenceRequest.max_tokens))
        .where(*recent).order_by(InferenceRequest.created_at.desc()).limit(MAX_SHAPES)).all()
    shapes = tuple((max(1, int(p or 1)), max(1, int(o or 1))) for p, o in rows)
    return eta.InteractiveLoad(count / INTERACTIVE_WINDOW_S, shapes)
