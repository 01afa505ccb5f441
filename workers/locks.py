"""Redis locks that keep periodic or redelivered work single (one batch releaser, one worker per
batch, one length-model retrain per served model).

Tasks are delivered at least once and beat may fire while a slow run is still going; a task
that cannot take its lock returns at once, since whoever holds it does the same work. Locks
expire (TTL), so a worker killed while holding one blocks nothing for long: work of unknown
length holds a short lock and renews it while it runs (`renew=True`), rather than a TTL longer
than its longest run (a batch lock of 15 minutes held a killed host's batch that long).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.exceptions import LockError, LockNotOwnedError
from redis.lock import Lock

__all__ = ["held"]

logger = logging.getLogger(__name__)


@contextmanager
def held(client: redis.Redis, name: str, *, ttl_s: float, renew: bool = False
         ) -> Iterator[bool]:
    """Yields whether the lock was free and is now ours; released on exit. With `renew`, a
    thread resets its TTL every third of it while the block runs."""
    # NOTE: not thread-local: the renewing thread resets the TTL with the holder's token.
    lock = client.lock(name, timeout=ttl_s, thread_local=False)
    if not lock.acquire(blocking=False):
        yield False
        return
    stop = threading.Event()
    renewer = threading.Thread(target=_renew, args=(lock, ttl_s / 3, stop), daemon=True,
                               name=f"renew {name}") if renew else None
    if renewer is not None:
        renewer.start()
    try:
        yield True
    finally:
        stop.set()
        if renewer is not None:
            renewer.join()
        try:
            lock.release()
        except LockError:  # expired meanwhile: the work is done, nothing left to release
            logger.warning("lock %s expired before its holder finished", name)


def _renew(lock: Lock, every_s: float, stop: threading.Event) -> None:
    """Resets the lock's TTL every `every_s` until `stop`; gives up once it is not ours (it
    expired and someone took it), keeps trying while Redis does not answer."""
    while not stop.wait(every_s):
        try:
            lock.reacquire()
        except LockNotOwnedError:
            logger.warning("lock %s lost while held: its TTL ran out", lock.name)
            return
        except redis.RedisError:
            continue
