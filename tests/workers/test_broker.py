"""The workers' broker channel keeps one client for its synchronous commands (publish, the
unacked index, acks), built again when the channel builds a new connection pool; messages go
through as with kombu's. Real Redis."""

from __future__ import annotations

import uuid

import pytest
from kombu import Connection

from tests.environment import TEST_REDIS_URL
from workers.broker import BROKER_TRANSPORT

pytestmark = pytest.mark.services


def test_a_channel_keeps_one_client_until_it_builds_a_new_pool() -> None:
    with Connection(TEST_REDIS_URL, transport=BROKER_TRANSPORT) as connection:
        channel = connection.default_channel
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second and first.connection_pool is channel.pool
        given = object()
        with channel.conn_or_acquire(given) as client:
            assert client is given

        channel._disconnect_pools()  # what a fork or a lost connection does
        with channel.conn_or_acquire() as rebuilt:
            assert rebuilt is not first and rebuilt.connection_pool is channel.pool


def test_messages_are_published_delivered_and_acknowledged() -> None:
    with Connection(TEST_REDIS_URL, transport=BROKER_TRANSPORT) as connection:
        queue = connection.SimpleQueue(f"blockq-test-broker-{uuid.uuid4().hex}")
        for k in range(3):
            queue.put({"k": k})
        received = []
        for _ in range(3):
            message = queue.get(timeout=5)
            received.append(message.payload["k"])
            message.ack()
        assert received == [0, 1, 2]
        with pytest.raises(queue.Empty):
            queue.get_nowait()  # acknowledged: not delivered again
        queue.close()
