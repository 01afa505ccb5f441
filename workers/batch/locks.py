"""Names and lifetimes of the batch locks (see workers.locks): one releaser at a time, one
worker per batch."""

from __future__ import annotations

__all__ = ["batch_lock_name", "RELEASER_LOCK", "LOCK_TTL_S"]

RELEASER_LOCK = "blockq:batches:releaser"
#: Longer than any one run of expansion or finalization (50,000 lines take well under this).
LOCK_TTL_S = 900.0


def batch_lock_name(batch_id: str) -> str:
    return f"blockq:batch:{batch_id}:lock"
