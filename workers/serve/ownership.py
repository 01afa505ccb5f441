"""The engine's ownership check: every `ownership_check_interval_s`, the requests this instance
runs are looked up in the database, and those that are no longer its own are aborted.

A request stops being this instance's when it is cancelled, or re-routed (its heartbeat lapsed:
the process was frozen or cut off; or the sweep found the engine not holding it). The attempt
check already refuses what such a stale run writes; aborting it frees the batch slot and its KV
cache at once. This is how abort-before-reroute holds for an instance that cannot be reached at
the moment it loses the request: it aborts the request as soon as it runs again, before it can
write anything, and whatever it streamed is marked interrupted by the new attempt.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future

from sqlalchemy import select

from domain.db import Database
from domain.models import InferenceRequest, RequestStatus
from workers.serve.engine import Engine, GenerationResult
from workers.serve.periodic import Periodic

__all__ = ["Attempts", "OwnershipCheck"]

logger = logging.getLogger(__name__)


class Attempts:
    """The attempt of each request this instance's engine runs, and its future (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, tuple[int, Future[GenerationResult]]] = {}

    def launch(self, request_id: str, attempt: int,
               submit: Callable[[], Future[GenerationResult]]) -> Future[GenerationResult]:
        """Submit to the engine and record the attempt, as one step for `abort_if_still`."""
        with self._lock:
            future = submit()
            self._running[request_id] = (attempt, future)
            return future

    def abort_if_still(self, request_id: str, attempt: int, abort: Callable[[str], None]
                       ) -> bool:
        """Abort the request if the engine still runs this attempt of it (not a newer one
        launched since the caller looked)."""
        with self._lock:
            if self._running.get(request_id, (None,))[0] != attempt:
                return False
            abort(request_id)
            return True

    def end(self, request_id: str, attempt: int) -> None:
        with self._lock:
            if self._running.get(request_id, (None,))[0] == attempt:
                del self._running[request_id]

    def other_attempt(self, request_id: str, attempt: int) -> Future[GenerationResult] | None:
        """The future of another attempt of this request still running here, if any."""
        with self._lock:
            running = self._running.get(request_id)
        return running[1] if running is not None and running[0] != attempt else None

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {request_id: attempt for request_id, (attempt, _) in self._running.items()}


class OwnershipCheck:
    """Aborts what the engine runs that the database no longer gives to this instance."""

    def __init__(self, instance_id: str, db: Database, engine: Engine, attempts: Attempts,
                 interval_s: float) -> None:
        self.instance_id = instance_id
        self.db = db
        self.engine = engine
        self.attempts = attempts
        self._thread = Periodic(f"{instance_id}-ownership", interval_s, self.check_once,
                                "ownership check failed on %s", instance_id)

    def start(self) -> None:
        self._thread.start()

    def signal_stop(self) -> None:
        self._thread.signal_stop()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def check_once(self) -> list[str]:
        """Abort the requests no longer ours; returns their ids."""
        running = self.attempts.snapshot()
        if not running:
            return []
        r = InferenceRequest
        with self.db.session() as session:
            rows = session.execute(
                select(r.id, r.attempt).where(r.id.in_(list(running)),
                                              r.status == str(RequestStatus.RUNNING),
                                              r.instance_id == self.instance_id)
            ).all()
        ours = {request_id for request_id, attempt in rows if running[request_id] == attempt}
        lost = [request_id for request_id in sorted(running.keys() - ours)
                if self.attempts.abort_if_still(request_id, running[request_id],
                                                self.engine.abort)]
        for request_id in lost:
            logger.warning("%s no longer runs %s (cancelled or re-routed): aborted",
                           self.instance_id, request_id)
        return lost
