"""The workers' Redis broker transport: kombu's, closing a channel cleanly on a lost connection.

Why (kombu up to 5.7.0, the newest release): when a worker loses Redis, Celery's consumer cleans
up the old connection twice, `Connection.collect()` and then `close()`. The first close of the
consuming channel reads the reply of its pending BRPOP (kombu#1733: a message popped during
shutdown is not lost); on a dead connection that read raises `ConnectionError`, so the channel is
left open, and `collect()` then detaches the transport (`transport.client = None`). The second
close goes on to restore the unacknowledged messages (with `task_acks_late`, every task in
flight) and builds a connection pool from the detached transport: `AttributeError: 'NoneType'
object has no attribute 'hostname'`, which Celery does not count as a connection error, so the
worker exits with "Unrecoverable error" instead of reconnecting.

Here a lost connection ends that read like an empty reply, and the close goes on while the
transport is attached: the unacknowledged messages are restored to their queues if Redis answers,
and otherwise stay in Redis' unacked index, restored after the visibility timeout; either way the
channel is closed once, and the consumer reconnects. The workers use it through
`BROKER_TRANSPORT` (workers/celery.py); processes that only send tasks (the API) keep kombu's.

The channel also keeps one client for its synchronous commands: kombu built a new redis-py
client (whose constructor copies its table of response callbacks) for each of them, and a task
of an acks-late worker costs three (the unacked index on delivery, the ack, the publish of what
it sends on). Clients share the channel's connection pool and are thread-safe; the kept one is
replaced when the channel builds a new pool (after a fork or a lost connection).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from queue import Empty
from typing import Any

from kombu.transport import redis

__all__ = ["BROKER_TRANSPORT", "Channel", "Transport"]

#: Celery's `broker_transport` for the workers (the URL stays `redis://...`).
BROKER_TRANSPORT = "workers.broker:Transport"


class Channel(redis.Channel):
    """kombu's Redis channel whose close survives a lost connection, with one client for its
    synchronous commands (module docstring)."""

    _sync_client: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        pool = self.pool
        kept = self._sync_client
        if kept is None or kept.connection_pool is not pool:
            kept = self._sync_client = self._create_client()
        yield kept

    def close(self) -> None:
        if self._in_poll:
            try:
                self._brpop_read()
            except Empty:
                pass
            except self.connection_errors:
                pass  # the connection is gone: there is no reply to read
        super().close()


class Transport(redis.Transport):
    Channel = Channel
