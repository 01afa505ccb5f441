"""What stays in Redis after the run: assignments, queued and unacknowledged messages."""

from __future__ import annotations

import json
import time

import redis

from domain.queues import SERVICE_QUEUES, queue_depths


def lasting_entries(redis_url: str, instance_ids: list[str], samples: int = 4,
                    interval_s: float = 2.0) -> list[str]:
    """Assignments, queued and unacknowledged messages present in every one of a few
    samples: the periodic tasks beat keeps sending come and go, leftovers stay. Each entry
    starts with its kind (`assigned`, `queued`, `unacked`) and a space."""
    client = redis.Redis.from_url(redis_url)
    seen: list[set[str]] = []
    try:
        for sample in range(samples):
            if sample:
                time.sleep(interval_s)
            seen.append(_entries(client, instance_ids))
    finally:
        client.close()
    return sorted(set.intersection(*seen))


def _entries(client: redis.Redis, instance_ids: list[str]) -> set[str]:
    entries = set()
    for instance_id in instance_ids:
        for request_id in client.hkeys(f"blockq:instance:{instance_id}:assigned"):
            entries.add(f"assigned {instance_id}: {request_id.decode()}")
    queues = [*SERVICE_QUEUES, *instance_ids]
    for queue, depths in queue_depths(client, queues).items():
        for step, depth in depths.items():
            # NOTE: a queue's messages have no stable id here: the oldest one's body is.
            oldest = client.lindex(queue if step == 0 else f"{queue}:{step}", -1) or b""
            entries.add(f"queued {queue}[{step}]: {depth} waiting, oldest "
                        f"{_task_name(oldest)}")
    for tag, message in client.hgetall("unacked").items():
        entries.add(f"unacked {tag.decode()}: {_task_name(message)}")
    return entries


def _task_name(message: bytes) -> str:
    """The Celery task name and id in a kombu message (or its start, if it is not one)."""
    try:
        payload = json.loads(message)
        if isinstance(payload, list):  # unacked entries: [message, exchange, routing_key]
            payload = payload[0]
        headers = payload.get("headers", {})
        return f"{headers.get('task')}[{headers.get('id')}] argsrepr={headers.get('argsrepr')}"
    except (ValueError, AttributeError, IndexError, TypeError):
        return message[:80].decode(errors="replace")
