"""The services an API process holds (settings, database, fleet view, tokenizer, Celery client),
built once by `create_app`; domain commands take them as an argument."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from celery import Celery

from domain.celery_app import create_celery
from domain.db import Database
from domain.live_fleet import Fleet
from domain.outbox import Outbox
from domain.principal_cache import PrincipalCache
from domain.prompts import PromptCodec
from domain.settings import Settings
from domain.stream_hub import HUB_BLOCK_MS, StreamHub

__all__ = ["Services", "shared_redis_pool"]

#: How long a call waits for a free connection of the shared pool before it is refused: 503
#: `redis_pool_exhausted`, saying so (app/api/held_connections.py). Held calls set up through a
#: per-team gate that leaves the pool room, so a pool still out this long is truly out: say it soon.
POOL_WAIT_S = 1.0
#: How long an API call waits for a pooled database connection: under gevent a burst of
#: thousands of calls queues for the pool's 15 connections (2,000 streams opened at once waited
#: past SQLAlchemy's default 30 s on a loaded machine and 184 of them got 503).
DB_POOL_WAIT_S = 120.0
#: A Redis that does not answer (cut off, not refusing) counts as an outage after this long,
#: rather than holding the call for ever.
REDIS_TIMEOUT_S = 5.0


def shared_redis_pool(settings: Settings) -> redis.BlockingConnectionPool:
    """At most `api_redis_connections` connections, however many calls an API worker serves at
    once (under gevent, thousands): a call waits for a free one."""
    return redis.BlockingConnectionPool.from_url(
        settings.redis_url, max_connections=settings.api_redis_connections, timeout=POOL_WAIT_S,
        socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S)


@dataclass(frozen=True)
class Services:
    settings: Settings
    db: Database
    fleet: Fleet
    prompts: PromptCodec
    # Used only to send tasks by name (see domain.dispatch); worker code is never imported.
    celery: Celery
    outbox: Outbox
    # The one reader of the output streams that held completions wait on (domain/stream_hub.py).
    streams: StreamHub
    # The process's authenticated keys, emptied at every key or team change.
    principals: PrincipalCache

    @classmethod
    def build(cls, settings: Settings) -> Services:
        db = Database(settings.resolved_database_url,
                      hide_parameters=not settings.log_request_content,
                      pool_timeout_s=DB_POOL_WAIT_S)
        celery = create_celery(settings)
        shared = redis.Redis(connection_pool=shared_redis_pool(settings))
        return cls(
            settings=settings,
            db=db,
            fleet=Fleet(shared, heartbeat_ttl_s=settings.heartbeat_ttl_s),
            prompts=PromptCodec(settings.resolved_model_path),
            celery=celery,
            # NOTE: the API answers right after a commit; its messages follow from a thread.
            outbox=Outbox(db, celery, send_in_background=True),
            # NOTE: the hub's reader has a connection of its own, whose reads time out a little
            # after the hub's longest XREAD: a Redis that vanished without closing the
            # connection is noticed.
            streams=StreamHub(
                redis.Redis.from_url(settings.redis_url, socket_timeout=HUB_BLOCK_MS / 1000 + 5,
                                     socket_connect_timeout=2),
                shared),
            principals=PrincipalCache.shared(settings.resolved_database_url),
        )
