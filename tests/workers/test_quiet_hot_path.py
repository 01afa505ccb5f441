"""Celery's per-task "received" and "succeeded" lines are left out for the hot path's tasks
only (workers/observability.py); retries, failures and every other task's lines stay."""

from __future__ import annotations

import logging

import pytest
from celery.app import trace

from domain import dispatch
from workers.observability import QuietHotPath


def _record(msg: str, task: str) -> logging.LogRecord:
    context = {"name": task, "id": "0f0f", "runtime": 0.01, "return_value": None, "exc": "x",
               "description": "raised unexpected"}
    return logging.LogRecord("celery.app.trace", logging.INFO, __file__, 1, msg, (context,),
                             None)


@pytest.mark.parametrize("task", [dispatch.TASK_PREDICT, dispatch.TASK_ROUTE,
                                  dispatch.TASK_GENERATE])
@pytest.mark.parametrize("msg", [trace.LOG_SUCCESS, trace.LOG_RECEIVED])
def test_hot_path_tasks_lose_their_received_and_succeeded_lines(msg: str, task: str) -> None:
    assert not QuietHotPath().filter(_record(msg, task))


@pytest.mark.parametrize(("msg", "task"), [
    (trace.LOG_SUCCESS, dispatch.TASK_WEBHOOK),
    (trace.LOG_RECEIVED, dispatch.TASK_BATCH_EXPAND),
    (trace.LOG_RETRY, dispatch.TASK_PREDICT),
    (trace.LOG_FAILURE, dispatch.TASK_GENERATE),
])
def test_other_lines_pass(msg: str, task: str) -> None:
    record = _record(msg, task)
    assert QuietHotPath().filter(record)
    assert task in record.getMessage()  # formatted as before
