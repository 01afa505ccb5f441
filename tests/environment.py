"""What the tests run against: the repository, the test PostgreSQL and Redis, free ports.

A plain module (not a conftest) so that test modules and conftest files can both import it.
"""

from __future__ import annotations

import os
from pathlib import Path

from app.cli.stack import free_port as free_port  # the tests' free ports are the stack's

ROOT = Path(__file__).resolve().parent.parent
# Test services: the local PostgreSQL and Redis (a separate database and Redis db number).
TEST_DATABASE_URL = os.environ.get(
    "BLOCKQ_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/blockq_test"
)
TEST_REDIS_URL = os.environ.get("BLOCKQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
TEST_WEBHOOK_SECRET = "whsec_" + "dGVzdC1zZWNyZXQtZm9yLWJsb2NrcS13ZWJob29rcw=="


