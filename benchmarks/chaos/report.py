"""The result as tables: faults and recovery, the workload, the invariants."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from benchmarks.chaos.resources import growth_rows
from benchmarks.chaos.run import RunResult


def report(result: RunResult, console: Console) -> None:
    console.print(_faults_table(result))
    console.print(_workload_table(result))
    console.print("API answers seen by clients (HTTP status or transport error): "
                  + ", ".join(f"{k}: {v}" for k, v in sorted(result.workload["answers"].items())))
    if result.workload["interruptions"]:
        console.print("Stream interruptions by cause: " + ", ".join(
            f"{k}: {v}" for k, v in result.workload["interruptions"].items()))
    if result.scale_events:
        console.print("Scale events: " + ", ".join(
            f"{k}: {v}" for k, v in sorted(result.scale_events.items())))
    if result.resources:
        console.print(_resources_table(result))
    console.print(_invariants_table(result))
    console.print(f"timings: {result.timings}; work dir: {result.work_dir}")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _faults_table(result: RunResult) -> Table:
    faults = Table(title="Faults (recovery: from the fault's end until every request in flight "
                   "at its start was terminal; fleet back: until every process ran, the API "
                   "was ready and every engine alive)")
    for column in ("fault", "injected", "in flight", "never recovered", "recovery p50 s",
                   "recovery max s", "fleet back p50 s", "fleet back max s", "fleet not back"):
        faults.add_column(column, justify="left" if column == "fault" else "right")
    for row in result.fault_summary:
        faults.add_row(row["kind"], str(row["injected"]), str(row["in_flight"]),
                       str(row["never_recovered"]), _seconds(row["recovery_p50_s"]),
                       _seconds(row["recovery_max_s"]), _seconds(row["fleet_back_p50_s"]),
                       _seconds(row["fleet_back_max_s"]), str(row["fleet_not_back"]))
    return faults


def _workload_table(result: RunResult) -> Table:
    work = Table(title="Workload (requests: batch lines count one each; retried: a client "
                 "needed more than one try)")
    for column in ("kind", "jobs", "requests", "accepted", "retried", "gave up",
                   "streams interrupted", "sync timeouts (504)", "failed"):
        work.add_column(column, justify="left" if column == "kind" else "right")
    for kind, counts in sorted(result.workload["by_kind"].items()):
        work.add_row(kind, str(counts.get("jobs", 0)), str(counts.get("requests", 0)),
                     str(counts.get("accepted", 0)), str(counts.get("retried", 0)),
                     str(counts.get("gave_up", 0)), str(counts.get("interrupted", 0)),
                     str(counts.get("timeout", 0)), str(counts.get("failed", 0)))
    return work


def _invariants_table(result: RunResult) -> Table:
    checks = Table(title=f"Invariants after settling ({result.settle['seconds']} s, "
                   f"settled: {result.settle['settled']})")
    checks.add_column("invariant")
    checks.add_column("violations", justify="right")
    checks.add_column("examples")
    for name, finding in result.findings.items():
        style = "red" if finding["count"] else "green"
        checks.add_row(name, f"[{style}]{finding['count']}[/{style}]",
                       "\n".join(finding["examples"][:3]))
    return checks


def _resources_table(result: RunResult) -> Table:
    samples = result.resources
    first, last = samples[0], samples[-1]
    table = Table(title=f"Resources over {last['t_s'] / 60:.0f} min, {len(samples)} samples "
                  "(each process with its children; early: median over the run's second "
                  "tenth, late: over its last). PostgreSQL "
                  f"{first['postgres_mb']} -> {last['postgres_mb']} MB, Redis "
                  f"{first['redis_mb']} -> {last['redis_mb']} MB, "
                  f"{first['redis_keys']} -> {last['redis_keys']} keys")
    for column in ("process", "MB early", "MB late", "MB max", "fds early", "fds late",
                   "fds max", "restarts"):
        table.add_column(column, justify="left" if column == "process" else "right")
    for row in growth_rows(samples):
        table.add_row(row["process"], *(_figure(row[key]) for key in (
            "rss_mb_early", "rss_mb_late", "rss_mb_max", "fds_early", "fds_late", "fds_max",
            "restarts")))
    return table


def _figure(value: float | int | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if isinstance(value, float) else str(value)
