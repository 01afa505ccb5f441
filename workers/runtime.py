"""Process-wide resources of a worker (database, Redis fleet view, tokenizer), built on first use.

This is the one module that holds process-global state on the Celery side. Tasks get what they
need from `get()`; tests and the engine worker may `configure()` it explicitly first.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import redis
from celery import Celery, current_app

from app.db import Database
from app.fleet import Fleet
from app.prompts import PromptCodec
from app.settings import Settings

if TYPE_CHECKING:
    from workers.predict.batcher import MicroBatcher
    from workers.predict.length_model import LengthPredictor
    from workers.predict.tasks import LengthAnswer, LengthQuery
from workers.sim import ExecModel, bundled_model, bundled_model_names

DEFAULT_EXEC_MODEL = "qwen2-7b-a30"

__all__ = ["Runtime", "get", "configure", "current_celery"]


@dataclass
class Runtime:
    settings: Settings

    @cached_property
    def db(self) -> Database:
        return Database(self.settings.resolved_database_url)

    @cached_property
    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.settings.redis_url)

    @cached_property
    def fleet(self) -> Fleet:
        return Fleet(self.redis, heartbeat_ttl_s=self.settings.heartbeat_ttl_s)

    @cached_property
    def routing_exec_model(self) -> ExecModel:
        """The execution-time model the block policies simulate instances with."""
        name = self.settings.routing_exec_model or (
            self.settings.emulated_exec_model
            if self.settings.engine_kind == "emulated"
            else DEFAULT_EXEC_MODEL
        )
        if name in bundled_model_names():
            return bundled_model(name)
        return ExecModel.load(Path(name))

    @cached_property
    def length_predictor(self) -> LengthPredictor:
        """The learned output-length model, loaded once per process (encoder included)."""
        # NOTE: torch and transformers load here, in predictor workers only, not at import.
        from workers.predict.length_model import BOOTSTRAP_ARTIFACT  # noqa: PLC0415
        from workers.predict.length_model import LengthPredictor as Predictor  # noqa: PLC0415

        return Predictor.load(self.settings.length_model_path or BOOTSTRAP_ARTIFACT, num_threads=1)

    @cached_property
    def length_batcher(self) -> MicroBatcher[LengthQuery, LengthAnswer]:
        """Concurrent predict tasks of this process share one batched pass of the length model."""
        from workers.predict.batcher import MicroBatcher  # noqa: PLC0415

        return MicroBatcher(self._predict_lengths, max_batch=32, name="length-batcher")

    def _predict_lengths(self, queries: Sequence[LengthQuery]) -> list[LengthAnswer]:
        from workers.predict.tasks import LengthAnswer  # noqa: PLC0415

        predictor = self.length_predictor
        predictions = predictor.predict_batch(
            [q.prompt for q in queries], self.settings.model_name, [q.max_tokens for q in queries]
        )
        return [LengthAnswer(p.tokens, p.p90_tokens, predictor.name) for p in predictions]

    @cached_property
    def prompts(self) -> PromptCodec:
        return PromptCodec(self.settings.resolved_model_path)


_runtime: Runtime | None = None
_lock = threading.Lock()


def configure(settings: Settings) -> Runtime:
    global _runtime
    with _lock:
        _runtime = Runtime(settings)
    return _runtime


def get() -> Runtime:
    if _runtime is None:
        return configure(current_app.conf.blockq_settings)
    return _runtime


def current_celery() -> Celery:
    """The Celery app running this task, for sending the next stage's task by name."""
    return current_app._get_current_object()  # type: ignore[attr-defined]
