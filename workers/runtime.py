"""The connections of a worker process (database, Redis, fleet view, bias watch, tokenizer) and
its stages' long-lived parts, each built on first use.

This is the one module that holds process-global state on the Celery side. Tasks get what they
need from `get()`; tests and the engine worker may `configure()` it explicitly first. A stage keeps
what must live as long as the process (a loaded model, a micro-batcher) as a `component` built
from the runtime, so that this module imports no stage.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

import redis
from celery import Celery, current_app

from domain.celery_app import create_celery
from domain.db import Database
from domain.length_bias import BiasRule, BiasWatch
from domain.live_fleet import Fleet
from domain.outbox import Outbox
from domain.prompts import PromptCodec
from domain.settings import Settings

__all__ = ["Runtime", "get", "configure", "current_celery"]

Component = TypeVar("Component")


@dataclass
class Runtime:
    settings: Settings
    _components: dict[Callable[[Runtime], Any], Any] = field(default_factory=dict)
    _components_lock: threading.RLock = field(default_factory=threading.RLock)

    @cached_property
    def db(self) -> Database:
        return Database(self.settings.resolved_database_url,
                        hide_parameters=not self.settings.log_request_content)

    @cached_property
    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.settings.redis_url)

    @cached_property
    def fleet(self) -> Fleet:
        return Fleet(self.redis, heartbeat_ttl_s=self.settings.heartbeat_ttl_s,
                     recent_window_s=self.settings.routing_future_window_s)

    @cached_property
    def bias_watch(self) -> BiasWatch:
        s = self.settings
        return BiasWatch(self.redis, BiasRule(window=s.bias_window, threshold=s.bias_threshold,
                                              fallback_s=s.bias_fallback_s,
                                              correction_rate=s.bias_correction_rate))

    @cached_property
    def celery(self) -> Celery:
        """The worker's Celery app when it runs on these settings, else one of its own."""
        app = current_celery()
        if getattr(app.conf, "blockq_settings", None) is self.settings:
            return app
        return create_celery(self.settings, set_as_current=False)

    @cached_property
    def outbox(self) -> Outbox:
        return Outbox(self.db, self.celery)

    @cached_property
    def prompts(self) -> PromptCodec:
        return PromptCodec(self.settings.resolved_model_path)

    #: The connections `sharing` may be given.
    SHAREABLE = frozenset({"db", "redis", "fleet", "celery", "outbox", "prompts"})

    @classmethod
    def sharing(cls, settings: Settings, **parts: Any) -> Runtime:
        """A runtime on the given connections instead of its own (the API routing in its
        process shares its database pool, Redis, fleet view, Celery app and outbox)."""
        unknown = parts.keys() - cls.SHAREABLE
        if unknown:
            raise TypeError(f"not shareable: {sorted(unknown)}")
        rt = cls(settings)
        rt.__dict__.update(parts)  # what each cached_property would have built
        return rt

    def component(self, build: Callable[[Runtime], Component]) -> Component:
        """The process's one `build(self)`, made on the first call (keyed by `build`)."""
        with self._components_lock:
            if build not in self._components:
                self._components[build] = build(self)
            return self._components[build]


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
