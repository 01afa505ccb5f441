"""What the tests run against: the repository, the test PostgreSQL and Redis, free ports.

A plain module (not a conftest) so that test modules and conftest files can both import it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Test services: the local PostgreSQL and Redis (a separate database and Redis db number).
TEST_DATABASE_URL = os.environ.get(
    "BLOCKQ_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/blockq_test"
)
TEST_REDIS_URL = os.environ.get("BLOCKQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
TEST_WEBHOOK_SECRET = "whsec_" + "dGVzdC1zZWNyZXQtZm9yLWJsb2NrcS13ZWJob29rcw=="


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
