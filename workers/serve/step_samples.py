"""The step-sample sink of an engine instance: engine steps buffered in memory (the engine's
thread must not wait for a database) and written in batches by a thread of its own."""

from __future__ import annotations

import dataclasses
from collections import deque
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert

from domain.db import Database
from domain.models import EngineStepSample, Instance, utcnow
from workers.serve.engine import StepSample
from workers.serve.periodic import Periodic

__all__ = ["StepSampleSink"]

#: Most samples kept while the database is away; the oldest go first.
MAX_BUFFERED_SAMPLES = 100_000
#: How long stop() waits for a flush in progress.
JOIN_TIMEOUT_S = 5.0


class StepSampleSink:
    """Buffers step samples; flushes them every `interval_s`, renewing the instance's
    last_seen_at (the database's own heartbeat of the instance) with each flush."""

    def __init__(self, instance_id: str, db: Database, interval_s: float) -> None:
        self.instance_id = instance_id
        self.db = db
        self._samples: deque[StepSample] = deque(maxlen=MAX_BUFFERED_SAMPLES)
        self._thread = Periodic(f"{instance_id}-samples", interval_s, self.flush,
                                "step sample flush failed on %s", instance_id)

    def add(self, sample: StepSample) -> None:
        """Called on the engine's thread: only appends."""
        self._samples.append(sample)

    def start(self) -> None:
        self._thread.start()

    def signal_stop(self) -> None:
        self._thread.signal_stop()

    def join(self) -> None:
        """Wait for the flushing thread, then write what is left."""
        self._thread.join(JOIN_TIMEOUT_S)
        self.flush()

    def flush(self) -> None:
        batch = [self._samples.popleft() for _ in range(len(self._samples))]
        with self.db.session() as session:
            if batch:
                session.execute(insert(EngineStepSample), [self._row(s) for s in batch])
            instance = session.get(Instance, self.instance_id)
            if instance is not None:
                instance.last_seen_at = utcnow()

    def _row(self, sample: StepSample) -> dict[str, Any]:
        row = dataclasses.asdict(sample)
        row["at"] = datetime.fromtimestamp(sample.at, UTC)
        row["instance_id"] = self.instance_id
        return row
