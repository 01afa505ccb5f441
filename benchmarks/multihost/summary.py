"""The run's result in one JSON object (the command's last line): the invariants as counts,
recovery per fault kind, and what the rig ran."""

from __future__ import annotations

from typing import Any

#: The chaos checks (benchmarks.chaos.checks) each headline count adds up.
HEADLINE = {
    "lost": ("accepted but no row",),
    "completed_twice": ("completed twice",),
    "missing_webhooks": ("webhooks missing", "batch webhooks missing"),
    "not_terminal": ("lost (not terminal)",),
}


def summary(*, requests: int, broker: str, findings: dict[str, dict[str, Any]],
            settle: dict[str, Any], fault_summary: list[dict[str, Any]],
            faults: list[dict[str, Any]], batches_not_terminal: int,
            extra: dict[str, Any]) -> dict[str, Any]:
    """`lost`: a client holds an id the database does not know; `not_terminal`: requests (and
    batches) not succeeded, failed, cancelled (batches: completed...) when settling ended;
    `completed_twice`: more than one terminal event; `missing_webhooks`: a terminal request or
    batch with no signed, 2xx-answered delivery of its final event. `violations`: every chaos
    check with a count above 0 (those four included)."""
    counts = {name: sum(findings.get(check, {}).get("count", 0) for check in checks)
              for name, checks in HEADLINE.items()}
    counts["not_terminal"] += batches_not_terminal
    return {
        "requests": requests, "broker": broker, **counts,
        "violations": {name: f["count"] for name, f in findings.items() if f["count"]},
        "settled_s": settle.get("seconds"), "settled": settle.get("settled"),
        "recovery": {row["kind"]: {"in_flight": row["in_flight"],
                                   "recovery_s": row["recovery_max_s"],
                                   "fleet_back_s": row["fleet_back_max_s"]}
                     for row in fault_summary},
        "faults": [{k: f.get(k) for k in ("kind", "target", "start", "end", "fleet_back_s",
                                          "recovery_s", "in_flight", "note", "moved_off")}
                   for f in faults],
        **extra,
    }
