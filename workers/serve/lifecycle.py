"""Engine-worker lifecycle: a Celery worker consuming exactly one `gpu.<k>` queue hosts that
instance's engine, built before consumption starts, withdrawn when shutdown starts, stopped at
its end.

`celery -A workers worker -Q gpu.0 --pool threads --concurrency 128` is an engine worker;
workers on other queues never build an engine.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from celery.signals import (
    celeryd_after_setup,
    celeryd_init,
    worker_shutdown,
    worker_shutting_down,
)

from domain.settings import Settings

__all__ = ["current_host", "engine_queue", "NotAnEngineWorker"]

logger = logging.getLogger(__name__)

ENGINE_QUEUE_PREFIX = "gpu."
_THREAD_POOLS = {"threads", "thread", "solo"}

_queue: str | None = None
_host: Any = None  # workers.serve.host.EngineHost once started


class NotAnEngineWorker(RuntimeError):
    """A serve task reached a worker that hosts no engine (wrong -Q or pool)."""


def engine_queue(queues: list[str]) -> str | None:
    """The instance this worker serves, from its -Q list; None for non-engine workers."""
    engine_queues = [q for q in queues if q.startswith(ENGINE_QUEUE_PREFIX)]
    if not engine_queues:
        return None
    if len(engine_queues) > 1 or len(queues) > 1:
        raise SystemExit(f"an engine worker consumes exactly one gpu.<k> queue, got {queues}")
    return engine_queues[0]


@celeryd_init.connect
def _note_queue(sender: Any = None, conf: Any = None, options: Any = None, **_: Any) -> None:
    global _queue
    raw = (options or {}).get("queues") or []
    queues = raw.split(",") if isinstance(raw, str) else list(raw)
    _queue = engine_queue(queues)


@celeryd_after_setup.connect
def _start_engine(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """After logging is set up and before the worker consumes anything."""
    global _host
    if _queue is None:
        return
    pool = getattr(instance, "pool_cls", "")
    pool_name = pool if isinstance(pool, str) else pool.__module__
    if pool_name.rsplit(".", 1)[-1] not in _THREAD_POOLS:
        raise SystemExit(
            f"an engine worker must run with --pool threads, not {pool_name!r}: the engine "
            "lives in the worker process and every task thread feeds it"
        )
    from workers import runtime  # noqa: PLC0415 - the lifecycle module must stay light
    from workers.serve.factory import build_engine_host  # noqa: PLC0415 - idem

    try:
        # NOTE: everything in an engine worker is about its instance: its runtime runs on the
        # instance's settings (its model, path, engine kind and hardware from the fleet).
        settings: Settings = runtime.configure(runtime.get().settings.for_instance(_queue)).settings
        _host = build_engine_host(_queue, settings)
        _host.start()
        # What the instance serves, in the worker's configuration: Flower's worker page shows
        # it (its Config tab; /api/workers under "conf").
        instance.app.conf.blockq_instance = {"instance_id": _queue,
                                             **dataclasses.asdict(_host.declared)}
    except Exception as exc:
        # NOTE: Celery's signal dispatch logs and swallows exceptions; a worker whose engine
        # failed must not go on consuming its queue, so exit instead.
        logger.exception("engine for %s failed to start", _queue)
        raise SystemExit(f"engine for {_queue} failed to start: {exc}") from exc


@worker_shutting_down.connect
def _withdraw(**_: Any) -> None:
    if _host is not None:
        _host.withdraw()


@worker_shutdown.connect
def _stop_engine(**_: Any) -> None:
    if _host is not None:
        _host.stop()


def current_host() -> Any:
    if _host is None:
        raise NotAnEngineWorker("this worker hosts no engine; start it with -Q gpu.<k>")
    return _host
