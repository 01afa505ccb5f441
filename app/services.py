"""The services an API process holds (settings, database, fleet view, tokenizer, Celery client),
built once by `create_app`; domain commands take them as an argument."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from celery import Celery

from app.celery_app import create_celery
from app.db import Database
from app.fleet import Fleet
from app.outbox import Outbox
from app.prompts import PromptCodec
from app.settings import Settings

__all__ = ["Services"]


@dataclass(frozen=True)
class Services:
    settings: Settings
    db: Database
    fleet: Fleet
    prompts: PromptCodec
    # Used only to send tasks by name (see app.dispatch); worker code is never imported.
    celery: Celery
    outbox: Outbox

    @classmethod
    def build(cls, settings: Settings) -> Services:
        db = Database(settings.resolved_database_url,
                      hide_parameters=not settings.log_request_content)
        celery = create_celery(settings)
        return cls(
            settings=settings,
            db=db,
            fleet=Fleet(
                redis.Redis.from_url(settings.redis_url), heartbeat_ttl_s=settings.heartbeat_ttl_s
            ),
            prompts=PromptCodec(settings.resolved_model_path),
            celery=celery,
            outbox=Outbox(db, celery),
        )

