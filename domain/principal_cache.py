"""The API's cache of authenticated keys, emptied the moment any key or team changes.

Every /v1 call authenticates its key, and looking it up was a database round trip of its own per
call (a share of the API's CPU worth saving: docs/measurements.md). An API process now keeps the
principals it has looked up, and a listener on PostgreSQL's `blockq_auth` channel empties its cache
whenever a key or team row changes: a trigger (migration 0018) notifies the channel from every
writer (the CLI, the admin API, hand-written SQL), and PostgreSQL delivers the notification at the
change's commit, to every listening process. A revoked key is refused as soon as that notification
arrives (a millisecond), on every API process; no entry outlives a change by a timeout.

Nothing is cached while the listener is not connected (before its LISTEN, after an error,
while it reconnects, on a database without the trigger): every call then looks its key up. A
lookup that raced with a change is not kept: the cache's generation, read before the lookup,
must be the same after it. Unknown keys are never cached (a guessing client cannot fill it).
"""

from __future__ import annotations

import logging
import select
import threading
from collections import OrderedDict
from typing import ClassVar

import psycopg
from sqlalchemy.engine import make_url

from domain.db import Database
from domain.teams import Principal, key_digest, principal_of_digest

__all__ = ["APPLICATION_NAME", "CHANNEL", "PrincipalCache"]

logger = logging.getLogger(__name__)

#: The channel of migration 0018's trigger.
CHANNEL = "blockq_auth"
#: The listener's connections, as PostgreSQL lists them (pg_stat_activity).
APPLICATION_NAME = "blockq-principal-cache"
#: Principals kept per process (least recently used out first).
MAX_ENTRIES = 10_000
#: How long the listener waits for a notification before it checks its connection.
CHECK_EVERY_S = 10.0
#: How long the listener waits before connecting again after its connection failed.
RETRY_AFTER_S = 1.0
#: TCP keep-alives of the listener's connection: a server that vanished without closing it is
#: noticed within about 30 s (meanwhile a change reaches the other API processes, not this one).
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
               "keepalives_count": 3}


class PrincipalCache:
    """One process's cache of the principals of one database (see the module docstring)."""

    _shared: ClassVar[dict[str, PrincipalCache]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, url: str, *, max_entries: int = MAX_ENTRIES) -> None:
        """`url`: the database's SQLAlchemy URL (PostgreSQL through psycopg is listened to;
        any other is looked up on every call)."""
        parsed = make_url(url)
        self._conninfo = (parsed.set(drivername="postgresql").render_as_string(
            hide_password=False) if parsed.get_backend_name() == "postgresql" else None)
        self.max_entries = max_entries
        self._entries: OrderedDict[str, Principal] = OrderedDict()
        self._lock = threading.Lock()
        self._generation = 0
        self._listening = False
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    @classmethod
    def shared(cls, url: str) -> PrincipalCache:
        """The process's cache of the database at `url` (one listener per process)."""
        with cls._shared_lock:
            cache = cls._shared.get(url)
            if cache is None:
                cache = cls._shared[url] = cls(url)
            return cache

    @property
    def generation(self) -> int:
        """Advances each time the cache is emptied (a change, or the listener connecting)."""
        return self._generation

    @property
    def listening(self) -> bool:
        return self._listening

    def lookup(self, db: Database, key: str) -> Principal | None:
        """The principal of a presented key, or None if it is unknown or revoked."""
        self._start()
        digest = key_digest(key)
        with self._lock:
            generation = self._generation
            found = self._entries.get(digest) if self._listening else None
            if found is not None:
                self._entries.move_to_end(digest)
                return found
        with db.autocommit() as connection:
            principal = principal_of_digest(connection, digest)
        if principal is not None:
            self._keep(digest, principal, generation)
        return principal

    def stop(self) -> None:
        """End the listener (it ends within `CHECK_EVERY_S`); nothing is cached after."""
        self._stopped.set()
        self._empty(listening=False)

    def _keep(self, digest: str, principal: Principal, generation: int) -> None:
        with self._lock:
            if not self._listening or self._generation != generation:
                return  # a change came meanwhile: the row read may predate it
            self._entries[digest] = principal
            if len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def _empty(self, *, listening: bool) -> None:
        with self._lock:
            self._entries.clear()
            self._generation += 1
            self._listening = listening and not self._stopped.is_set()

    def _start(self) -> None:
        if self._conninfo is None or self._thread is not None or self._stopped.is_set():
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._listen, name="principal-cache",
                                                 daemon=True)
                self._thread.start()

    def _listen(self) -> None:
        assert self._conninfo is not None
        while not self._stopped.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5,
                                     application_name=APPLICATION_NAME,
                                     **_KEEPALIVES) as connection:
                    connection.execute(f"LISTEN {CHANNEL}")
                    self._empty(listening=True)  # what changed while nobody listened
                    self._relay(connection)
            except psycopg.Error as exc:
                logger.warning("key cache listener: %s; keys are looked up until it is back",
                               type(exc).__name__)
            self._empty(listening=False)
            self._stopped.wait(RETRY_AFTER_S)

    def _relay(self, connection: psycopg.Connection) -> None:
        """Empty the cache at each notification, until stopped or the connection fails.

        The wait is a `select` on the connection's socket (cooperative under gevent), not
        psycopg's `notifies(timeout=...)`, which wakes ten times a second to poll, spending CPU in
        every idle API process (docs/measurements.md)."""
        while not self._stopped.is_set():
            readable, _, _ = select.select([connection.fileno()], [], [], CHECK_EVERY_S)
            if not readable:
                connection.execute("SELECT 1")  # a connection the server closed fails here
                continue
            for _ in connection.notifies(timeout=0):
                self._empty(listening=True)
