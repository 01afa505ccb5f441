"""Process-wide resources of a worker (database, Redis fleet view, tokenizer), built on first use.

This is the one module that holds process-global state on the Celery side. Tasks get what they
need from `get()`; tests and the engine worker may `configure()` it explicitly first.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import redis
from celery import Celery, current_app

from app.bias import BiasRule, BiasWatch
from app.db import Database
from app.fleet import Fleet
from app.prompts import PromptCodec
from app.settings import Settings
from workers.learn import registry
from workers.learn.active import ActiveModel

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
    _exec_models: dict[str, ActiveModel[ExecModel]] = field(default_factory=dict)

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
    def length_model(self) -> ActiveModel[LengthPredictor]:
        """The registry's active length model of the served model (hot-reloaded), else the
        configured or packaged one. One encoder is loaded; versions swap only the head."""
        from workers.predict.length_model import LengthHead  # noqa: PLC0415

        return ActiveModel(
            self.db, registry.KIND_LENGTH, self.settings.model_name,
            load=lambda artifact: self.length_predictor.with_head(LengthHead.from_bytes(artifact)),
            default=lambda: self.length_predictor,
            interval_s=self.settings.model_reload_interval_s,
        )

    @cached_property
    def length_batcher(self) -> MicroBatcher[LengthQuery, LengthAnswer]:
        """Concurrent predict tasks of this process share one batched pass of the length model."""
        from workers.predict.batcher import MicroBatcher  # noqa: PLC0415

        return MicroBatcher(self._predict_lengths, max_batch=32, name="length-batcher")

    def _predict_lengths(self, queries: Sequence[LengthQuery]) -> list[LengthAnswer]:
        from workers.predict.tasks import LengthAnswer  # noqa: PLC0415

        predictor = self.length_model.get()
        predictions = predictor.predict_batch(
            [q.prompt for q in queries], self.settings.model_name, [q.max_tokens for q in queries]
        )
        factor = self.bias_watch.correction(self.settings.model_name)
        return [
            LengthAnswer(_scaled(p.tokens, factor, q.max_tokens),
                         _scaled(p.p90_tokens, factor, q.max_tokens), predictor.name)
            for p, q in zip(predictions, queries, strict=True)
        ]

    @cached_property
    def bias_watch(self) -> BiasWatch:
        s = self.settings
        return BiasWatch(self.redis, BiasRule(window=s.bias_window, threshold=s.bias_threshold,
                                              fallback_s=s.bias_fallback_s,
                                              correction_rate=s.bias_correction_rate))

    def exec_models(self, instance_ids: Iterable[str]) -> dict[str, ExecModel]:
        """Each instance's active execution-time model (refit from its own steps, hot-reloaded),
        else `routing_exec_model`."""
        return {i: self._exec_model_of(i).get() for i in instance_ids}

    def _exec_model_of(self, instance_id: str) -> ActiveModel[ExecModel]:
        with _lock:
            if instance_id not in self._exec_models:
                self._exec_models[instance_id] = ActiveModel(
                    self.db, registry.KIND_EXEC, instance_id, load=_exec_model_of_artifact,
                    default=lambda: self.routing_exec_model,
                    interval_s=self.settings.model_reload_interval_s)
            return self._exec_models[instance_id]

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


def _exec_model_of_artifact(artifact: bytes) -> ExecModel:
    return ExecModel.from_dict(json.loads(artifact))


def _scaled(tokens: int, factor: float, cap: int) -> int:
    return max(1, min(cap, round(tokens * factor)))


def current_celery() -> Celery:
    """The Celery app running this task, for sending the next stage's task by name."""
    return current_app._get_current_object()  # type: ignore[attr-defined]
