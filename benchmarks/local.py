"""The local services and stack a benchmark runs on: its own PostgreSQL database and Redis db
(never the tests' ones), emptied before a run, and a stack whose processes see the run's
settings, not the caller's BLOCKQ_* variables."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import redis

from app.cli.stack import Stack
from benchmarks.paths import TINY_MODEL
from domain.migrate import recreate_database, upgrade
from domain.settings import Settings

__all__ = ["BENCH_DATABASE_URL", "BENCH_REDIS_URL", "add_service_arguments", "bench_stack",
           "fresh_services", "stack_environment"]

#: The benchmarks' own database and Redis db (the tests use blockq_test and db 15).
BENCH_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/blockq_bench"
BENCH_REDIS_URL = "redis://127.0.0.1:6379/14"


def add_service_arguments(parser: argparse.ArgumentParser, *, model_path: bool = False) -> None:
    """--database-url and --redis-url (and --model-path, the tiny Llama by default)."""
    if model_path:
        parser.add_argument("--model-path", type=Path, default=TINY_MODEL)
    parser.add_argument("--database-url", default=BENCH_DATABASE_URL)
    parser.add_argument("--redis-url", default=BENCH_REDIS_URL)


def fresh_services(database_url: str, redis_url: str) -> None:
    """An empty database at the newest migration and an empty Redis db."""
    recreate_database(database_url)
    upgrade(database_url)
    redis.Redis.from_url(redis_url).flushdb()


def stack_environment(settings: Settings) -> dict[str, str]:
    """This process's environment without its BLOCKQ_* variables, then the settings'."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKQ_")}
    return {**env, **settings.as_env()}


def bench_stack(settings: Settings) -> Stack:
    """The local stack on `settings` alone (not started)."""
    return Stack(settings, env=stack_environment(settings))
