"""Shared fixtures: the real PostgreSQL and Redis, a fresh schema, the tiny model, settings."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from app.migrate import recreate_database, upgrade
from app.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
# Test services: the local PostgreSQL and Redis (a separate database and Redis db number).
TEST_DATABASE_URL = os.environ.get(
    "BLOCKQ_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/blockq_test"
)
TEST_REDIS_URL = os.environ.get("BLOCKQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
TEST_WEBHOOK_SECRET = "whsec_" + "dGVzdC1zZWNyZXQtZm9yLWJsb2NrcS13ZWJob29rcw=="


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def model_path() -> Path:
    path = Path(os.environ.get("BLOCKQ_MODEL_PATH", ROOT / ".blockq" / "models" / "tiny-llama"))
    if not (path / "config.json").exists():
        pytest.fail(f"tiny model missing at {path}: run scripts/setup.sh (make test does)")
    return path


@pytest.fixture
def fresh_services(model_path: Path, tmp_path: Path) -> Iterator[Settings]:
    """Settings on an empty, migrated PostgreSQL database and an empty Redis db."""
    recreate_database(TEST_DATABASE_URL)
    upgrade(TEST_DATABASE_URL)
    client = redis.Redis.from_url(TEST_REDIS_URL)
    client.flushdb()
    yield Settings(
        database_url=TEST_DATABASE_URL,
        redis_url=TEST_REDIS_URL,
        data_dir=tmp_path,
        model_path=model_path,
        api_port=free_port(),
        flower_port=free_port(),
        webhook_secret=TEST_WEBHOOK_SECRET,
        log_format="text",  # readable test output; the JSON log test asks for json
    )
    client.flushdb()
    client.close()
