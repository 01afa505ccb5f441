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

from benchmarks import services_lock
from domain.migrate import alembic_config, recreate_database
from domain.settings import Settings
from tests.databases import TemplateState, copy_of_template, drop_database, template_url
from tests.environment import (
    ROOT,
    RUN_DATABASE_URL,
    RUN_REDIS_URL,
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


def _hold_services(config: pytest.Config, database_url: str, redis_url: str) -> None:
    """Holds the services' locks (benchmarks/services_lock.py) until the process ends; stops the run
    with the holder's name if another run has them."""
    try:
        config.stash[_SERVICES_LOCKS] = services_lock.hold({
            "BLOCKQ_TEST_DATABASE_URL": database_url,
            "BLOCKQ_TEST_REDIS_URL": redis_url,
        })
    except services_lock.ServicesBusy as busy:
        pytest.exit(str(busy), returncode=pytest.ExitCode.USAGE_ERROR)


def pytest_sessionstart(session: pytest.Session) -> None:
    """A parallel run (pytest-xdist's controller, which collects nothing) holds the run's
    services from its start, so that a second run on the same ones stops before any worker
    starts; each worker then holds its own (pytest_collection_finish)."""
    if session.config.pluginmanager.has_plugin("dsession"):
        _hold_services(session.config, RUN_DATABASE_URL, RUN_REDIS_URL)


def pytest_collection_finish(session: pytest.Session) -> None:
    """A run (or worker) whose tests use the test PostgreSQL or Redis holds them until it ends;
    a second run on the same ones stops here, before it empties them."""
    if any(item.get_closest_marker("services") for item in session.items):
        _hold_services(session.config, TEST_DATABASE_URL, TEST_REDIS_URL)


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


@pytest.fixture(scope="session")
def migrated_template() -> Iterator[str]:
    """A database migrated to head once per test process (`<test database>_template`): each
    fresh database is a copy of it or is put back in its state (tests/databases.py), not a new
    run of every migration (about a second); the same schema and the same seeded rows."""
    url = template_url(TEST_DATABASE_URL)
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
    drop_database(url)


@pytest.fixture(scope="session")
def fresh_database(migrated_template: str) -> Callable[[], None]:
    """Makes the test database as the template is: a copy the first time (and whenever its
    tables changed), else emptied in place (a few milliseconds, tests/databases.py)."""
    state = TemplateState.read(migrated_template)
    copied = False

    def make() -> None:
        nonlocal copied
        if not (copied and state.restore(TEST_DATABASE_URL)):
            copy_of_template(migrated_template, TEST_DATABASE_URL)
            copied = True

    return make


@pytest.fixture(scope="session")
def services_factory(
    model_path: Path, fresh_database: Callable[[], None]
) -> Callable[[Path], Settings]:
    """Empties the test PostgreSQL database (the migrated template's state) and the test Redis
    db, and returns the settings of a test on them, with `data_dir` as its data directory."""

    def make(data_dir: Path) -> Settings:
        fresh_database()
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
