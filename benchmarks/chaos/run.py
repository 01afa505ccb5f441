"""One chaos run, start to finish: own services, the stack, traffic under faults, settling, the
checks, and the result."""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.cli.stack import Stack, process_commands
from benchmarks.chaos.checks import Checker, Finding
from benchmarks.chaos.config import RunConfig
from benchmarks.chaos.faults import (
    CRASH_AFTER_COMMIT_EXIT,
    Fault,
    Injector,
    crash_faults,
    fault_kinds,
    schedule_faults,
)
from benchmarks.chaos.processes import ProcessWatch, log_tail
from benchmarks.chaos.receiver import WebhookReceiver
from benchmarks.chaos.recovery import stranded_recovery
from benchmarks.chaos.resources import ResourceSampler
from benchmarks.chaos.scaling import ScaleDriver
from benchmarks.chaos.services import OwnServices
from benchmarks.chaos.settle import settle
from benchmarks.chaos.stack_setup import create_teams, signing_secrets, stack_env, stack_settings
from benchmarks.chaos.summaries import summarize_faults, workload_summary
from benchmarks.chaos.workload import Workload
from domain.db import Database
from domain.migrate import upgrade
from domain.settings import Settings

__all__ = ["RunConfig", "RunResult", "run"]


@dataclass
class RunResult:
    config: dict[str, Any]
    faults: list[dict[str, Any]]
    fault_summary: list[dict[str, Any]]
    findings: dict[str, dict[str, Any]]
    workload: dict[str, Any]
    exits: list[dict[str, Any]]
    settle: dict[str, Any]
    timings: dict[str, float]
    work_dir: str
    #: On an autoscaled fleet: starts and drains begun (by the autoscaler, forced by the
    #: faults), stack restarts after the supervisor's death.
    scale_events: dict[str, int] = field(default_factory=dict)
    #: With `RunConfig.resource_interval_s`: the samples (`ResourceSampler.samples`).
    resources: list[dict[str, Any]] = field(default_factory=list)

    def violations(self) -> dict[str, dict[str, Any]]:
        """The invariants that failed, with their stories."""
        return {name: f for name, f in self.findings.items() if f["count"]}


@dataclass
class _Parts:
    """What a run has started, shared by its steps."""

    config: RunConfig
    services: OwnServices
    settings: Settings
    stack: Stack
    receiver: WebhookReceiver
    db: Database
    log: Callable[[str], None]
    began: float  # monotonic time the run began
    timings: dict[str, float] = field(default_factory=dict)
    watch: ProcessWatch | None = None
    driver: ScaleDriver | None = None  # the autoscaler, on an autoscaled fleet
    sampler: ResourceSampler | None = None  # the soak's samples


@contextlib.contextmanager
def _work_dir(config: RunConfig) -> Iterator[Path]:
    if config.work_dir is not None:
        config.work_dir.mkdir(parents=True, exist_ok=True)
        yield config.work_dir
        return
    path = Path(tempfile.mkdtemp(prefix="blockq-chaos-"))
    path.chmod(0o755)  # PostgreSQL's user (when we are root) must reach its directory below
    try:
        yield path
    finally:
        if not config.keep:
            shutil.rmtree(path, ignore_errors=True)


def run(config: RunConfig, log: Callable[[str], None] = print) -> RunResult:
    """One chaos run, start to finish; everything it started is stopped when it returns."""
    with _work_dir(config) as work_dir:
        services = OwnServices(work_dir / "services")
        services.start()
        try:
            return _run_on(config, services, work_dir, log)
        finally:
            services.stop()


def _run_on(config: RunConfig, services: OwnServices, work_dir: Path,
            log: Callable[[str], None]) -> RunResult:
    began = time.monotonic()
    upgrade(services.database_url)
    settings = stack_settings(config, services, work_dir / "data")
    rng = random.Random(config.seed)
    schedule = schedule_faults(_chosen_kinds(config, settings), config.faults_per_kind, rng)
    duration_s = config.duration_s or max(30.0, len(schedule) * config.seconds_per_fault)
    receiver = WebhookReceiver(config.webhook_fail_first)
    stack = Stack(settings, env=stack_env(settings, config))
    names = [n for n in process_commands(settings) if n != "flower"]
    db = Database(settings.resolved_database_url)
    parts = _Parts(config, services, settings, stack, receiver, db, log, began)
    try:
        parts.watch = _start_stack(parts, names)
        teams = create_teams(settings, receiver.url)
        receiver.secrets.extend(signing_secrets(settings))
        log(f"stack up in {parts.timings['stack_ready_s']:.0f} s ({', '.join(names)}); "
            f"{config.requests} requests over {duration_s:.0f} s, {len(schedule)} faults; "
            f"logs in {stack.log_dir}")
        workload, injector = _traffic_under_faults(parts, parts.watch, teams, schedule,
                                                   duration_s, rng)
        return _checked_result(parts, parts.watch, workload, injector, teams, work_dir)
    finally:
        if parts.sampler is not None:
            parts.sampler.stop()
        if parts.driver is not None:
            parts.driver.stop()
        if parts.watch is not None:
            parts.watch.stop()
        stack.stop(timeout_s=20)
        db.dispose()
        receiver.close()


def _chosen_kinds(config: RunConfig, settings: Settings) -> list[str]:
    """The fault kinds asked for (default: all); SystemExit for one this stack has not."""
    kinds = config.kinds or fault_kinds(settings)
    unknown = set(kinds) - set(fault_kinds(settings))
    if unknown:
        raise SystemExit(f"unknown fault kinds {sorted(unknown)}; known: {fault_kinds(settings)}")
    return kinds


def _start_stack(parts: _Parts, names: list[str]) -> ProcessWatch:
    """Starts the stack's processes, waits until it is ready, supervises it; the watch on it."""
    initial = set(parts.settings.initial_instance_ids)
    standby = set(parts.settings.instance_ids) - initial
    parts.stack.start(names=[n for n in names if n not in standby])
    parts.stack.wait_ready(num_instances=len(initial))
    parts.timings["stack_ready_s"] = time.monotonic() - parts.began
    parts.stack.supervise()
    watch = ProcessWatch(parts.stack)
    watch.start()
    if parts.config.resource_interval_s:
        parts.sampler = ResourceSampler(parts.stack, parts.services.database_url,
                                        parts.services.redis_url,
                                        parts.config.resource_interval_s)
        parts.sampler.start()
    if parts.settings.autoscale:
        parts.driver = ScaleDriver(parts.stack, parts.settings, names)
        parts.driver.start()
    return watch


def _traffic_under_faults(parts: _Parts, watch: ProcessWatch, teams: dict[str, tuple[str, str]],
                          schedule: list[str], duration_s: float, rng: random.Random
                          ) -> tuple[Workload, Injector]:
    """Sends the job while a thread injects the scheduled faults; returns when both are done."""
    config = parts.config
    team_keys = {name: key for name, (_, key) in teams.items()}
    deadline = time.monotonic() + duration_s + config.settle_timeout_s
    workload = Workload(parts.stack, parts.receiver, team_keys, config, deadline=deadline)
    injector = Injector(parts.stack, parts.services, watch, config,
                        random.Random(rng.random()), parts.driver)
    stop_faults = threading.Event()
    start = time.monotonic() + 1.0
    fault_thread = threading.Thread(
        target=injector.run, args=(schedule, start, duration_s, stop_faults), daemon=True)
    fault_thread.start()
    workload.run(start, duration_s, random.Random(rng.random()))
    parts.timings["traffic_s"] = time.monotonic() - start
    parts.log(f"all {workload.submitted} requests answered; waiting for the last faults")
    fault_thread.join()
    parts.timings["faults_s"] = time.monotonic() - start
    parts.log("faults over; settling")
    return workload, injector


def _checked_result(parts: _Parts, watch: ProcessWatch, workload: Workload, injector: Injector,
                    teams: dict[str, tuple[str, str]], work_dir: Path) -> RunResult:
    """Settles, measures recovery, checks the guarantees; the run's result."""
    config = parts.config
    settled = settle(parts.db, parts.receiver, config.settle_timeout_s)
    resources: list[dict[str, Any]] = []
    if parts.sampler is not None:
        parts.sampler.stop()
        resources, parts.sampler = parts.sampler.samples, None
    faults = injector.faults + crash_faults(parts.stack.log_dir)
    faults.sort(key=lambda f: f.start)
    recovery = stranded_recovery(parts.db, faults)
    checker = Checker(parts.db, parts.services, parts.settings, parts.receiver,
                      workload.outcomes, dict(teams.values()), parts.stack.api_url)
    findings = checker.run()
    workload.close()
    injector.close()
    parts.timings["total_s"] = time.monotonic() - parts.began
    exits = [asdict(e) for e in watch.exits]
    _unexpected_exits(findings, watch, parts.stack.log_dir)
    scale_events: dict[str, int] = {}
    if parts.driver is not None:
        errors = findings.setdefault("autoscaler round errors",
                                     Finding("autoscaler round errors"))
        for error in parts.driver.errors:
            errors.add(error)
        scale_events = {**parts.driver.events, "stack restarts": parts.driver.restarts,
                        # queued messages of an earlier attempt, fenced (not a violation)
                        "stale messages left in a stopped instance's queue":
                            len(checker.stale_messages)}
    return RunResult(
        config={k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        faults=_fault_rows(faults, recovery),
        fault_summary=summarize_faults(faults, recovery),
        findings={name: asdict(f) for name, f in findings.items()},
        workload=workload_summary(workload), exits=exits, settle=settled,
        timings={k: round(v, 1) for k, v in parts.timings.items()}, work_dir=str(work_dir),
        scale_events=scale_events, resources=resources)


def _unexpected_exits(findings: dict[str, Finding], watch: ProcessWatch, log_dir: Path) -> None:
    """A finding for every process that exited with no fault to blame (the crash-after-commit
    fault point's exit status aside), with the last error line of its log."""
    unexpected = [e for e in watch.exits if e.cause is None
                  and e.code != CRASH_AFTER_COMMIT_EXIT]
    finding = findings.setdefault("unexpected process exits",
                                  Finding("unexpected process exits"))
    for e in unexpected:
        at = time.strftime("%H:%M:%S", time.localtime(e.at))
        finding.add(f"{e.name} pid {e.pid} exit {e.code} at {at}: "
                    f"{log_tail(log_dir / (e.name + '.log'), e.at)}")


def _fault_rows(faults: list[Fault], recovery: list[tuple[int, float | None, str | None]]
                ) -> list[dict[str, Any]]:
    """Each fault as JSON, with its requests in flight, recovery time and last request."""
    return [{**f.to_json(), "in_flight": n, "recovery_s": t, "last_request": rid}
            for f, (n, t, rid) in zip(faults, recovery, strict=True)]
