"""Database plumbing: engine and session factory built from Settings, and the session scope."""

from __future__ import annotations

import select
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError, TimeoutError
from sqlalchemy.orm import Session, sessionmaker

__all__ = ["Database", "TRANSIENT_ERRORS"]

#: Database errors a retry may outlive: the server restarting or unreachable, a connection
#: terminated, the pool exhausted.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError, TimeoutError)


class Database:
    """One engine and session factory per process. Callers own the transaction scope.

    `hide_parameters`: SQLAlchemy errors (and so every log line and traceback showing one) do
    not render the statement's bound values, which hold prompts, outputs and metadata. Only the
    debug setting `log_request_content` turns it off.
    """

    def __init__(self, url: str, *, echo: bool = False, hide_parameters: bool = True,
                 pool_timeout_s: float = 30.0) -> None:
        """`pool_timeout_s`: how long a caller waits for a pooled connection when all are in
        use before the call fails as a database outage."""
        self.url = url
        self.engine: Engine = _create_engine(url, echo=echo, hide_parameters=hide_parameters,
                                             pool_timeout_s=pool_timeout_s)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on error."""
        with self.sessions.begin() as session:
            yield session

    @contextmanager
    def autocommit(self) -> Iterator[Connection]:
        """A connection on which each statement is its own transaction, for work of one
        statement (a read, a delete): the statement is its one round trip, without BEGIN and
        COMMIT (two more round trips, and two more statements for the server)."""
        with self.engine.connect() as connection:
            yield connection.execution_options(isolation_level="AUTOCOMMIT")

    def dispose(self) -> None:
        self.engine.dispose()


def _create_engine(url: str, *, echo: bool, hide_parameters: bool,
                   pool_timeout_s: float) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, echo=echo, hide_parameters=hide_parameters,
                               connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # NOTE: psycopg's connections are checked for a server hang-up as they leave the pool by a
    # look at their socket (`_drop_if_hung_up`), not by pool_pre_ping's SELECT 1: the ping was
    # a round trip before every transaction of every process (client CPU and a server wake-up
    # each, several per request: docs/measurements.md). Other drivers keep the ping.
    psycopg = make_url(url).get_driver_name() == "psycopg"
    engine = create_engine(url, echo=echo, hide_parameters=hide_parameters,
                           pool_pre_ping=not psycopg, pool_size=5, max_overflow=10,
                           pool_timeout=pool_timeout_s)
    if psycopg:
        event.listen(engine, "checkout", _drop_if_hung_up)
    return engine


def _drop_if_hung_up(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """Refuse a pooled psycopg connection the server has closed (restart, terminated backend):
    the pool then opens a new one, as it does after a failed pre-ping.

    An idle connection has nothing to read; a server that ended it has sent its FATAL message
    and closed the socket, which makes the socket readable. A connection that merely reads as
    readable for another reason is replaced, which costs a reconnect, never an error. What no
    look can see (a server dying between this check and the first statement, or a silent
    network partition) a ping could not see either: the callers' outage handling covers it.
    """
    if dbapi_connection.closed or dbapi_connection.broken:
        raise DisconnectionError("pooled connection closed")
    try:
        poller = select.poll()
        poller.register(dbapi_connection.pgconn.socket, select.POLLIN | select.POLLPRI)
        ready = poller.poll(0)
    except Exception as exc:  # noqa: BLE001 - no socket to look at: not usable either
        raise DisconnectionError(f"pooled connection unusable ({type(exc).__name__})") from exc
    if ready:
        raise DisconnectionError("the server closed this pooled connection")


def _sqlite_pragmas(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
    # NOTE: several processes (API, workers) share the embedded database file: WAL lets readers
    # run beside the one writer, and busy_timeout makes writers wait instead of failing.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
