"""The API's key cache (domain/principal_cache.py): a key is looked up once, and every change to a
key or team (migration 0018's trigger, at its commit) empties the cache of every process that
listens; nothing is cached while nobody listens, and a lookup that raced with a change is not
kept. Real PostgreSQL: each cache listens on a connection of its own, as an API process does."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from domain import principal_cache
from domain.db import Database
from domain.principal_cache import PrincipalCache
from domain.settings import Settings
from domain.teams import create_team, issue_key, revoke_key, team_by_name

pytestmark = pytest.mark.services


def eventually(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


class NoDatabase:
    """A database no lookup may reach: what it returns came from the cache."""

    @contextmanager
    def autocommit(self) -> Iterator[None]:
        raise AssertionError("the key was looked up in the database")
        yield


@pytest.fixture
def db(fresh_services: Settings) -> Iterator[Database]:
    database = Database(fresh_services.resolved_database_url)
    yield database
    database.dispose()


@pytest.fixture
def listening(fresh_services: Settings) -> Iterator[Callable[[], PrincipalCache]]:
    """New caches of the test database (each its own listener, as one API process has),
    listening when returned."""
    caches: list[PrincipalCache] = []

    def make() -> PrincipalCache:
        cache = PrincipalCache(fresh_services.resolved_database_url)
        caches.append(cache)
        cache._start()
        eventually(lambda: cache.listening)
        return cache

    yield make
    for cache in caches:
        cache.stop()


def _key(db: Database, team: str = "acme") -> tuple[str, str]:
    with db.session() as session:
        issued = issue_key(session, create_team(session, team))
    return issued.key, issued.key_id


def _cached_key(db: Database, listening) -> tuple[PrincipalCache, str, str]:
    """A listening cache that holds a new key: the cache, the key and its id."""
    cache = listening()
    key, key_id = _key(db)
    assert cache.lookup(db, key) is not None
    return cache, key, key_id


def test_a_key_is_looked_up_once_then_kept(db: Database, listening) -> None:
    cache = listening()
    key, _ = _key(db)
    first = cache.lookup(db, key)
    assert first is not None and first.team_name == "acme"
    assert cache.lookup(NoDatabase(), key) == first  # type: ignore[arg-type]
    assert cache.lookup(db, "bq-unknown") is None
    with pytest.raises(AssertionError, match="looked up"):  # unknown keys are not kept
        cache.lookup(NoDatabase(), "bq-unknown")  # type: ignore[arg-type]


def test_a_revoked_key_is_refused_by_every_process_at_the_revocation_commit(
        db: Database, listening) -> None:
    one, other = listening(), listening()
    key, key_id = _key(db)
    assert one.lookup(db, key) is not None and other.lookup(db, key) is not None
    before = one.generation, other.generation
    with db.session() as session:
        revoke_key(session, key_id)
    eventually(lambda: one.generation > before[0] and other.generation > before[1])
    assert one.lookup(db, key) is None and other.lookup(db, key) is None


def test_a_team_change_empties_the_cache(db: Database, listening) -> None:
    cache = listening()
    key, _ = _key(db)
    assert cache.lookup(db, key).slo_miss_action == "route"  # type: ignore[union-attr]
    before = cache.generation
    with db.session() as session:
        team_by_name(session, "acme").slo_miss_action = "refuse"
    eventually(lambda: cache.generation > before)
    assert cache.lookup(db, key).slo_miss_action == "refuse"  # type: ignore[union-attr]


def test_hand_written_sql_empties_the_cache_too(db: Database, listening) -> None:
    cache, key, key_id = _cached_key(db, listening)
    before = cache.generation
    with db.engine.begin() as connection:
        connection.execute(sa.text("UPDATE api_keys SET revoked_at = now() WHERE id = :id"),
                           {"id": key_id})
    eventually(lambda: cache.generation > before)
    assert cache.lookup(db, key) is None


def test_nothing_is_kept_without_a_listener(db: Database) -> None:
    cache = PrincipalCache("sqlite:///unused.sqlite3")  # nothing to listen to
    key, _ = _key(db)
    assert cache.lookup(db, key) is not None
    with pytest.raises(AssertionError, match="looked up"):
        cache.lookup(NoDatabase(), key)  # type: ignore[arg-type]


def test_a_lookup_that_raced_with_a_change_is_not_kept(
        db: Database, listening, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = listening()
    key, _ = _key(db)
    read = principal_cache.principal_of_digest

    def read_then_change(connection, digest):  # a change commits while the row is read
        found = read(connection, digest)
        cache._empty(listening=True)
        return found

    monkeypatch.setattr(principal_cache, "principal_of_digest", read_then_change)
    assert cache.lookup(db, key) is not None
    monkeypatch.setattr(principal_cache, "principal_of_digest", read)
    with pytest.raises(AssertionError, match="looked up"):
        cache.lookup(NoDatabase(), key)  # type: ignore[arg-type]


def test_a_listener_whose_connection_is_killed_connects_again(db: Database, listening) -> None:
    """Meanwhile nothing is kept; once it listens again, a revocation empties it as before."""
    cache, key, key_id = _cached_key(db, listening)
    before = cache.generation
    with db.engine.begin() as connection:
        killed = connection.execute(sa.text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
            "current_database() AND application_name = :name"),
            {"name": principal_cache.APPLICATION_NAME}).all()
    assert killed
    eventually(lambda: cache.generation > before)
    eventually(lambda: cache.listening)
    assert cache.lookup(db, key) is not None
    listened = cache.generation
    with db.session() as session:
        revoke_key(session, key_id)
    eventually(lambda: cache.generation > listened)
    assert cache.lookup(db, key) is None
