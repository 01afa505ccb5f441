"""What the tests run against: the repository, the test PostgreSQL and Redis, free ports.

A plain module (not a conftest) so that test modules and conftest files can both import it.

A run uses the database and Redis db of BLOCKQ_TEST_DATABASE_URL and BLOCKQ_TEST_REDIS_URL (the
run's services). Under pytest-xdist (`-n N`) each worker process gets its own of both, derived
from the run's (`worker_services`), so that workers never empty each other's database.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy.engine import make_url

from app.cli.stack import free_port as free_port  # the tests' free ports are the stack's

ROOT = Path(__file__).resolve().parent.parent
#: Redis's default number of dbs (`databases 16`): db numbers are 0 to 15.
REDIS_DBS = 16

# The run's services: the local PostgreSQL and Redis (a separate database and Redis db number).
RUN_DATABASE_URL = os.environ.get(
    "BLOCKQ_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/blockq_test"
)
RUN_REDIS_URL = os.environ.get("BLOCKQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
TEST_WEBHOOK_SECRET = "whsec_" + "dGVzdC1zZWNyZXQtZm9yLWJsb2NrcS13ZWJob29rcw=="


def xdist_worker_index() -> int | None:
    """This process's pytest-xdist worker number (`gw3` -> 3), None outside a worker."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return int(worker.removeprefix("gw")) if worker else None


def worker_services(index: int, database_url: str = RUN_DATABASE_URL,
                    redis_url: str = RUN_REDIS_URL) -> tuple[str, str]:
    """Worker `index`'s database and Redis URLs: the run's database name with `_gw<index>`,
    and the Redis db `index + 1` places after the run's, wrapping past 15 and skipping db 0
    (the default of every other client, the local stack's included): with the default db 15,
    workers 0-3 use dbs 1-4. At most 14 workers."""
    parsed_db = make_url(database_url)
    database = parsed_db.set(database=f"{parsed_db.database}_gw{index}").render_as_string(
        hide_password=False)
    parts = urlsplit(redis_url)
    base = int(parts.path.strip("/") or 0)
    spare = [db for step in range(1, REDIS_DBS) if (db := (base + step) % REDIS_DBS) != 0]
    if index >= len(spare):
        raise ValueError(f"at most {len(spare)} test workers: Redis has {REDIS_DBS} dbs, one "
                         "each (run fewer with -n)")
    return database, urlunsplit(parts._replace(path=f"/{spare[index]}"))


_WORKER = xdist_worker_index()
#: The services of this process's tests: the run's, or its worker's own under pytest-xdist.
TEST_DATABASE_URL, TEST_REDIS_URL = (
    (RUN_DATABASE_URL, RUN_REDIS_URL) if _WORKER is None else worker_services(_WORKER))
