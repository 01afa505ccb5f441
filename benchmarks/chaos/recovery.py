"""Recovery times: how long the requests in flight at each fault took to finish after it."""

from __future__ import annotations

from sqlalchemy import select

from benchmarks.chaos.faults import Fault
from benchmarks.chaos.terminal import TERMINAL
from domain.db import Database
from domain.models import InferenceRequest


def stranded_recovery(db: Database, faults: list[Fault]
                      ) -> list[tuple[int, float | None, str | None]]:
    """Per fault: (requests in flight when it began, seconds from its end until the last of
    them that ever finished was terminal, that request's id); 0 s when all were terminal before
    the fault ended. A request that never finished (reported as lost) is left out of every
    fault's time and counted once, by the first fault after its creation: the time is None for
    that fault. Batch lines count from their release (their row's birth)."""
    with db.session() as session:
        spans = [(rid, created.timestamp(), None if finished is None else finished.timestamp(),
                  status)
                 for rid, created, finished, status in session.execute(
                     select(InferenceRequest.id, InferenceRequest.created_at,
                            InferenceRequest.finished_at, InferenceRequest.status))]
    starts = sorted(f.start for f in faults)
    blamed = {rid: next((t for t in starts if t > created), None)
              for rid, created, finished, status in spans
              if finished is None or status not in TERMINAL}
    result: list[tuple[int, float | None, str | None]] = []
    for fault in faults:
        stranded = [(rid, finished) for rid, created, finished, status in spans
                    if created < fault.start and (finished is None or finished > fault.start)]
        never = [rid for rid, t in blamed.items() if t == fault.start]
        done = [(rid, finished) for rid, finished in stranded
                if rid not in blamed and finished is not None]
        if never:
            result.append((len(stranded), None, never[0]))
        elif not done:
            result.append((len(stranded), 0.0, None))
        else:
            rid, last = max(done, key=lambda item: item[1])
            result.append((len(stranded), max(0.0, last - fault.end), rid))
    return result
