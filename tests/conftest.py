"""Shared fixtures: the real PostgreSQL and Redis, a fresh schema, the tiny model, settings."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from app.migrate import recreate_database, upgrade
from app.settings import Settings
from tests.environment import (
    ROOT,
    TEST_DATABASE_URL,
    TEST_REDIS_URL,
    TEST_WEBHOOK_SECRET,
    free_port,
)

#: Markers a test gets for using a fixture (see pyproject.toml for each marker's meaning).
MARKERS_OF_FIXTURES = {
    "fresh_services": "services",  # the real PostgreSQL and Redis
    "empty_redis": "services",  # the real Redis
    "vllm_engine": "vllm",  # tests/workers/serve: an in-process vLLM engine
}


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marks each test by the fixtures it uses, so that `-m` selects by what a test needs."""
    for fixture, marker in MARKERS_OF_FIXTURES.items():
        if fixture in getattr(item, "fixturenames", ()):
            item.add_marker(marker)


@pytest.fixture
def empty_redis() -> Iterator[redis.Redis]:
    """A client of the test Redis db, emptied before and after the test."""
    client = redis.Redis.from_url(TEST_REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


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
        webhook_allowed_networks="127.0.0.0/8",  # the tests' webhook receivers
        log_format="text",  # readable test output; the JSON log test asks for json
    )
    client.flushdb()
    client.close()
