"""Celery queue depths, read straight from the Redis broker.

Celery's Redis transport (kombu) keeps one Redis list per queue and priority step: with the
`sep=":"` and priority steps 0-9 of domain/celery_app.py, queue `q` is the lists `q` (priority 0)
and `q:1` ... `q:9`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence

import redis

from domain import dispatch

__all__ = ["PRIORITY_STEPS", "SEPARATOR", "SERVICE_QUEUES", "queue_depths", "queue_keys",
           "request_ids_in_broker", "stale_unacked", "drop_unacked"]

PRIORITY_STEPS = tuple(range(10))
SEPARATOR = ":"
#: kombu's Redis transport: messages taken by a worker and not yet acknowledged (a hash by
#: delivery tag), and when each was taken (a sorted set).
UNACKED_KEY = "unacked"
UNACKED_INDEX_KEY = "unacked_index"
#: Request and batch ids as `store.new_request_id` and `batches.new_batch_id` make them; a
#: task's first argument is in the clear in its message's `argsrepr` header.
_SUBJECT_ID = re.compile(rb"(?:req|batch)_[0-9a-f]{32}")
#: Queues every deployment has; engine queues (gpu.<k>) are the registered instances.
SERVICE_QUEUES = (dispatch.QUEUE_PREDICT, dispatch.QUEUE_PREDICT_BULK, dispatch.QUEUE_ROUTE,
                  dispatch.QUEUE_WEBHOOKS, dispatch.QUEUE_HEALTH, dispatch.QUEUE_LEARN,
                  dispatch.QUEUE_BATCHES)


def queue_keys(queue: str, *, priority_steps: Sequence[int] = PRIORITY_STEPS,
               sep: str = SEPARATOR) -> list[str]:
    """The Redis lists of one Celery queue, as kombu's Redis transport names them: the queue
    itself for the lowest step, `<queue><sep><step>` for each other priority step."""
    steps = sorted(set(priority_steps)) or [0]
    return [queue] + [f"{queue}{sep}{step}" for step in steps[1:]]


def queue_depths(client: redis.Redis, queues: Iterable[str], *,
                 priority_steps: Sequence[int] = PRIORITY_STEPS, sep: str = SEPARATOR
                 ) -> dict[str, dict[int, int]]:
    """Messages waiting in each queue, by priority step (steps with none left out)."""
    names = list(queues)
    steps = sorted(set(priority_steps)) or [0]
    with client.pipeline(transaction=False) as pipe:
        for queue in names:
            for key in queue_keys(queue, priority_steps=steps, sep=sep):
                pipe.llen(key)
        lengths = iter(pipe.execute())
    depths = {}
    for queue in names:
        counted = {step: next(lengths) for step in steps}
        depths[queue] = {step: n for step, n in counted.items() if n}
    return depths


def request_ids_in_broker(client: redis.Redis, queues: Iterable[str], *, fresh_s: float,
                          priority_steps: Sequence[int] = PRIORITY_STEPS, sep: str = SEPARATOR
                          ) -> set[str]:
    """Requests (and batches) that some message in the broker concerns: waiting in one of
    `queues`, or taken by a worker less than `fresh_s` ago and not yet acknowledged (an older one
    is presumed to have died with its worker; kombu redelivers it only after the visibility
    timeout)."""
    with client.pipeline(transaction=False) as pipe:
        for queue in queues:
            for key in queue_keys(queue, priority_steps=priority_steps, sep=sep):
                pipe.lrange(key, 0, -1)
        pipe.zrangebyscore(UNACKED_INDEX_KEY, time.time() - fresh_s, "+inf")
        *waiting, fresh_tags = pipe.execute()
    raw = [message for messages in waiting for message in messages]
    if fresh_tags:
        raw += [m for m in client.hmget(UNACKED_KEY, fresh_tags) if m is not None]
    return {match.decode() for message in raw for match in _SUBJECT_ID.findall(message)}


def stale_unacked(client: redis.Redis, *, older_than_s: float) -> dict[bytes, set[str]]:
    """Delivery tag -> the ids its message concerns, of messages taken by a worker more than
    `older_than_s` ago and not acknowledged."""
    tags = client.zrangebyscore(UNACKED_INDEX_KEY, "-inf", time.time() - older_than_s)
    if not tags:
        return {}
    messages = client.hmget(UNACKED_KEY, tags)
    return {tag: {m.decode() for m in _SUBJECT_ID.findall(message or b"")}
            for tag, message in zip(tags, messages, strict=True)}


def drop_unacked(client: redis.Redis, tags: Iterable[bytes]) -> None:
    """Forget unacknowledged messages (what kombu's acknowledgement does): their work is done,
    so a redelivery after the visibility timeout could do nothing but waste a worker's time."""
    tags = list(tags)
    if tags:
        with client.pipeline(transaction=True) as pipe:
            pipe.zrem(UNACKED_INDEX_KEY, *tags)
            pipe.hdel(UNACKED_KEY, *tags)
            pipe.execute()
