"""The result in aggregate: recovery per fault kind, and what the clients saw per job kind."""

from __future__ import annotations

from collections import Counter, defaultdict
from statistics import median
from typing import Any

from benchmarks.chaos.faults import Fault
from benchmarks.chaos.workload import Workload


def _percentile_summary(values: list[float]) -> tuple[float | None, float | None]:
    return (median(values), max(values)) if values else (None, None)


def summarize_faults(faults: list[Fault],
                     recovery: list[tuple[int, float | None, str | None]]
                     ) -> list[dict[str, Any]]:
    """Per fault kind: faults injected, requests stranded, recovery and fleet-back times."""
    by_kind: dict[str, list[tuple[Fault, tuple[int, float | None]]]] = defaultdict(list)
    for fault, (n, t, _) in zip(faults, recovery, strict=True):
        by_kind[fault.kind].append((fault, (n, t)))
    summary = []
    for kind in sorted(by_kind):
        items = by_kind[kind]
        stranded = [r for _, r in items]
        times = [t for _, t in stranded if t is not None]
        back = [f.fleet_back_s for f, _ in items if f.fleet_back_s is not None]
        p50, worst = _percentile_summary(times)
        back_p50, back_max = _percentile_summary(back)
        summary.append({
            "kind": kind, "injected": len(items),
            "in_flight": sum(n for n, _ in stranded),
            "never_recovered": sum(1 for n, t in stranded if n and t is None),
            "recovery_p50_s": p50, "recovery_max_s": worst,
            "fleet_back_p50_s": back_p50, "fleet_back_max_s": back_max,
            "fleet_not_back": sum(1 for f, _ in items if f.fleet_back_s is None
                                  and f.kind != "crash-after-commit"),
        })
    return summary


def workload_summary(workload: Workload) -> dict[str, Any]:
    """Per job kind: jobs, requests, accepted, retried...; every answer and interruption."""
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    for o in workload.outcomes:
        counts = by_kind[o.kind]
        counts["jobs"] += 1
        counts["requests"] += o.lines if o.kind == "batch" else 1
        counts["accepted"] += o.accepted
        counts["retried"] += o.tries > 1
        counts["interrupted"] += bool(o.interrupted)
        if o.note:
            counts[o.note.split(":")[0].split(" ")[0]] += 1
    return {"by_kind": {k: dict(v) for k, v in by_kind.items()},
            "answers": dict(workload.statuses),
            "interruptions": dict(Counter(o.interrupted for o in workload.outcomes
                                          if o.interrupted)),
            "client_errors": [o.note for o in workload.outcomes
                              if o.note and o.note.startswith(("client error", "refused"))][:10]}
