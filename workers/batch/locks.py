"""Names and lifetimes of the batch locks (see workers.locks): one releaser at a time, one
worker per batch."""

from __future__ import annotations

__all__ = ["batch_lock_name", "RELEASER_LOCK", "LOCK_TTL_S"]

RELEASER_LOCK = "blockq:batches:releaser"
#: A batch lock's TTL: its holder renews it while it works (workers.locks.held(renew=True)), so
#: a worker killed mid-expansion or mid-finalization holds its batch this long at most.
LOCK_TTL_S = 30.0


def batch_lock_name(batch_id: str) -> str:
    return f"blockq:batch:{batch_id}:lock"
