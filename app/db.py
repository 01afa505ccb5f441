"""Database plumbing: engine and session factory built from Settings, and the session scope."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import InterfaceError, OperationalError, TimeoutError
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

    def __init__(self, url: str, *, echo: bool = False, hide_parameters: bool = True) -> None:
        self.url = url
        self.engine: Engine = _create_engine(url, echo=echo, hide_parameters=hide_parameters)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on error."""
        with self.sessions.begin() as session:
            yield session

    def dispose(self) -> None:
        self.engine.dispose()


def _create_engine(url: str, *, echo: bool, hide_parameters: bool) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, echo=echo, hide_parameters=hide_parameters,
                               connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, echo=echo, hide_parameters=hide_parameters, pool_pre_ping=True,
                         pool_size=5, max_overflow=10)


def _sqlite_pragmas(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
    # NOTE: several processes (API, workers) share the embedded database file: WAL lets readers
    # run beside the one writer, and busy_timeout makes writers wait instead of failing.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
