"""Logs and metrics of Celery processes, wired by signals: blockq's log format (instead of
Celery's) tagged with the process role and the running task's request id, and the optional
metrics server of a worker (Settings.metrics_port).

The role of a worker is its node name before the "@" (`-n predict@%h` is "predict", an engine
worker's is its instance id); beat's is "beat".
"""

from __future__ import annotations

import logging
from typing import Any

from celery.app import trace
from celery.signals import (
    celeryd_init,
    setup_logging,
    task_postrun,
    task_prerun,
    worker_init,
)

from domain import dispatch, logs, metrics
from workers import runtime

__all__ = ["QuietHotPath"]

#: Tasks every request passes through, whose per-task "received" and "succeeded" lines
#: Celery's logs leave out: blockq logs each request's routing and completion itself.
HOT_PATH_TASKS = frozenset({dispatch.TASK_PREDICT, dispatch.TASK_ROUTE, dispatch.TASK_GENERATE})


class QuietHotPath(logging.Filter):
    """Drops Celery's "Task ... received" and "Task ... succeeded" INFO records of the hot
    path's tasks (two per task, four per request, each formatted and written on the request's
    path: docs/measurements.md); every other record of those loggers, retries and failures
    included, passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg is not trace.LOG_SUCCESS and record.msg is not trace.LOG_RECEIVED:
            return True
        context = record.args
        return not (isinstance(context, dict) and context.get("name") in HOT_PATH_TASKS)

_role: str | None = None


@celeryd_init.connect
def _note_role(sender: Any = None, **_: Any) -> None:
    """Before logging is set up: the worker's node name gives its role."""
    global _role
    _role = str(sender or "worker").split("@", 1)[0]


@setup_logging.connect
def _setup_logging(**_: Any) -> None:
    """A receiver here makes Celery leave the root logger to us."""
    # NOTE: of the Celery programs blockq runs, workers (named by celeryd_init, which comes
    # first) and beat set up Celery's logging; Flower does not.
    logs.configure(runtime.get().settings, role=_role or "beat")
    for name in ("celery.app.trace", "celery.worker.strategy"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, QuietHotPath) for f in logger.filters):
            logger.addFilter(QuietHotPath())


@worker_init.connect
def _serve_metrics(**_: Any) -> None:
    metrics.serve_process_metrics(runtime.get().settings)


@task_prerun.connect
def _bind_request(args: Any = None, kwargs: Any = None, **_: Any) -> None:
    logs.bind_request_id(logs.request_id_of(args, kwargs))


@task_postrun.connect
def _unbind_request(**_: Any) -> None:
    logs.bind_request_id(None)
