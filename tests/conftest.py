"""Shared fixtures: the real PostgreSQL and Redis, a fresh schema, the tiny model, settings."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from alembic import command
from sqlalchemy.engine import make_url

from app.migrate import alembic_config, recreate_database
from app.settings import Settings
from tests import services_lock
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


_SERVICES_LOCKS = pytest.StashKey[ExitStack]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """A run whose tests use the test PostgreSQL or Redis holds them (tests/services_lock.py)
    until it ends; a second run on the same ones stops here, before it empties them."""
    if not any(item.get_closest_marker("services") for item in session.items):
        return
    try:
        session.config.stash[_SERVICES_LOCKS] = services_lock.hold({
            "BLOCKQ_TEST_DATABASE_URL": TEST_DATABASE_URL,
            "BLOCKQ_TEST_REDIS_URL": TEST_REDIS_URL,
        })
    except services_lock.ServicesBusy as busy:
        pytest.exit(str(busy), returncode=pytest.ExitCode.USAGE_ERROR)


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


def _template_url(url: str) -> str:
    parsed = make_url(url)
    return parsed.set(database=f"{parsed.database}_template").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def migrated_template() -> Iterator[str]:
    """A database migrated to head once per session (`<test database>_template`): each fresh
    database is a copy of it (CREATE DATABASE ... TEMPLATE, a few hundred milliseconds), not a
    new run of every migration (about a second); the same schema and the same seeded rows."""
    url = _template_url(TEST_DATABASE_URL)
    recreate_database(url)
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:  # migrations/env.py runs on this connection
            config = alembic_config(url)
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
    finally:
        engine.dispose()  # nobody may be connected to a template while it is copied
    yield url
    _drop_database(url)


def _admin_engine(url: str) -> sa.Engine:
    return sa.create_engine(make_url(url).set(database="postgres"), isolation_level="AUTOCOMMIT")


def _drop_database(url: str) -> None:
    admin = _admin_engine(url)
    with admin.connect() as connection:
        connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" '
                                   "WITH (FORCE)"))
    admin.dispose()


def copy_of_template(template_url: str, url: str = TEST_DATABASE_URL) -> None:
    """Drop the database of `url` (closing its connections) and create it again as a copy of
    the migrated template."""
    admin = _admin_engine(url)
    with admin.connect() as connection:
        name, template = make_url(url).database, make_url(template_url).database
        connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        connection.execute(sa.text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    admin.dispose()


@pytest.fixture(scope="session")
def services_factory(
    model_path: Path, migrated_template: str
) -> Callable[[Path], Settings]:
    """Empties the test PostgreSQL database (a fresh migrated copy) and the test Redis db, and
    returns the settings of a test on them, with `data_dir` as its data directory."""

    def make(data_dir: Path) -> Settings:
        copy_of_template(migrated_template)
        client = redis.Redis.from_url(TEST_REDIS_URL)
        client.flushdb()
        client.close()
        return Settings(
            database_url=TEST_DATABASE_URL,
            redis_url=TEST_REDIS_URL,
            data_dir=data_dir,
            model_path=model_path,
            api_port=free_port(),
            flower_port=free_port(),
            webhook_secret=TEST_WEBHOOK_SECRET,
            webhook_allowed_networks="127.0.0.0/8",  # the tests' webhook receivers
            log_format="text",  # readable test output; the JSON log test asks for json
        )

    return make


@pytest.fixture
def fresh_services(
    services_factory: Callable[[Path], Settings], tmp_path: Path
) -> Iterator[Settings]:
    """Settings on an empty, migrated PostgreSQL database and an empty Redis db."""
    yield services_factory(tmp_path)
    client = redis.Redis.from_url(TEST_REDIS_URL)
    client.flushdb()
    client.close()
