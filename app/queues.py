"""Celery queue depths, read straight from the Redis broker.

Celery's Redis transport (kombu) keeps one Redis list per queue and priority step: with the
`sep=":"` and priority steps 0-9 of workers/celery_app.py, queue `q` is the lists `q` (priority 0)
and `q:1` ... `q:9`.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis

from app import dispatch

__all__ = ["PRIORITY_STEPS", "SERVICE_QUEUES", "queue_depths"]

PRIORITY_STEPS = tuple(range(10))
SEPARATOR = ":"
#: Queues every deployment has; engine queues (gpu.<k>) are the registered instances.
SERVICE_QUEUES = (dispatch.QUEUE_PREDICT, dispatch.QUEUE_PREDICT_BULK, dispatch.QUEUE_ROUTE,
                  dispatch.QUEUE_WEBHOOKS, dispatch.QUEUE_HEALTH, dispatch.QUEUE_LEARN,
                  dispatch.QUEUE_BATCHES)


def _list_name(queue: str, priority: int) -> str:
    return f"{queue}{SEPARATOR}{priority}" if priority else queue


def queue_depths(client: redis.Redis, queues: Iterable[str]) -> dict[str, dict[int, int]]:
    """Messages waiting in each queue, by priority step (steps with none left out)."""
    names = list(queues)
    with client.pipeline(transaction=False) as pipe:
        for queue in names:
            for priority in PRIORITY_STEPS:
                pipe.llen(_list_name(queue, priority))
        lengths = pipe.execute()
    steps = len(PRIORITY_STEPS)
    return {queue: {p: n for p, n in zip(PRIORITY_STEPS, lengths[i * steps:(i + 1) * steps],
                                         strict=True) if n}
            for i, queue in enumerate(names)}
