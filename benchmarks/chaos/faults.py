"""The faults: their kinds, their schedule, their injection one at a time, and the crashes of
the crash-after-commit fault point found in the processes' logs."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import redis

from app.cli.stack import Stack, process_commands
from benchmarks.chaos.config import RunConfig
from benchmarks.chaos.processes import ProcessWatch
from benchmarks.chaos.scaling import SCALE_KINDS, ScaleDriver
from benchmarks.chaos.services import OwnServices
from domain.settings import Settings

#: Environment variable of domain/faults.py: a process exits right after a commit whose message
#: (outbox entry) has not been sent yet, with this probability per such commit.
CRASH_AFTER_COMMIT_ENV = "BLOCKQ_FAULT_CRASH_AFTER_COMMIT"
#: Exit status of a process the crash-after-commit fault point ended.
CRASH_AFTER_COMMIT_EXIT = 70
#: What domain/faults.py logs just before it ends a process.
CRASH_AFTER_COMMIT_LINE = "fault point: exiting after a commit"


@dataclass
class Fault:
    kind: str
    target: str
    start: float  # wall time
    end: float  # wall time the fault ended (signal sent, server back, process resumed)
    fleet_back_s: float | None = None  # end -> every process up, API ready, engines alive
    note: str = ""
    #: The process a SIGKILL or SIGTERM ended (not in the JSON result).
    victim: Any = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "start": self.start, "end": self.end,
                "fleet_back_s": self.fleet_back_s, "note": self.note}


def fault_kinds(settings: Settings) -> list[str]:
    """Every fault kind of this stack: the process kinds come from process_commands."""
    instances = set(settings.instance_ids)
    groups = sorted({"gpu" if name in instances else name
                     for name in process_commands(settings) if name != "flower"})
    return ([f"sigkill:{g}" for g in groups] + [f"sigterm:{g}" for g in groups]
            + ["sigstop:gpu", "redis:restart-empty", "postgres:restart-immediate",
               "postgres:terminate-connections", "control:no-fault"]
            + (SCALE_KINDS if settings.autoscale else []))


class Injector:
    """Injects the scheduled faults one at a time: each at a random moment of its slot of the
    traffic, and not before the system is whole again after the previous one."""

    def __init__(self, stack: Stack, services: OwnServices, watch: ProcessWatch,
                 config: RunConfig, rng: random.Random, driver: ScaleDriver | None = None
                 ) -> None:
        self.stack, self.services, self.watch = stack, services, watch
        self.driver = driver  # the autoscaler, on an autoscaled fleet
        self.config, self.rng = config, rng
        self.faults: list[Fault] = []
        self.redis = redis.Redis.from_url(services.redis_url, socket_timeout=1,
                                          socket_connect_timeout=1)
        self.http = httpx.Client(base_url=stack.api_url, timeout=2)

    def run(self, schedule: list[str], start: float, duration_s: float,
            stop: threading.Event) -> None:
        for number, kind in enumerate(schedule):
            slot = start + duration_s * (number + self.rng.random()) / len(schedule)
            while time.monotonic() < slot and not stop.is_set():
                time.sleep(0.05)
            if stop.is_set():
                return
            fault = self.inject(kind)
            fault.fleet_back_s = self.wait_fleet_back(fault)
            self.faults.append(fault)

    def inject(self, kind: str) -> Fault:
        action, what = kind.split(":")
        ttl = self.stack.settings.heartbeat_ttl_s
        # NOTE: an autoscaled fleet's stopped slots have no process to signal.
        instances = [i for i in self.stack.settings.instance_ids if i in self.stack.processes]
        target = self.rng.choice(instances) if what == "gpu" else what
        start = time.time()
        note = ""
        victim = None
        if action in ("sigkill", "sigterm"):
            victim = self.stack.processes[target]
            self.watch.signal(target, signal.SIGKILL if action == "sigkill" else signal.SIGTERM,
                              kind)
        elif action == "sigstop":
            self.watch.signal(target, signal.SIGSTOP, kind)
            time.sleep(ttl * self.rng.uniform(1.5, 2.5))
            self.watch.signal(target, signal.SIGCONT, kind)
            self.watch.forget(target)
        elif kind == "redis:restart-empty":
            target = "redis"
            self.services.kill_redis()
            time.sleep(self.rng.uniform(0.5, 3.0))
            self.services.start_redis()
        elif kind == "postgres:restart-immediate":
            target = "postgres"
            self.services.restart_postgres()
        elif kind == "postgres:terminate-connections":
            target = "postgres"
            note = f"{self.services.terminate_connections()} connections"
        elif action == "scale":
            target, note, victim = self._scale(kind)
        elif kind != "control:no-fault":
            raise ValueError(f"unknown fault kind {kind!r}")
        return Fault(kind, target, start, time.time(), note=note, victim=victim)

    def _scale(self, kind: str) -> tuple[str, str, Any]:
        """A forced scale event (benchmarks/chaos/scaling.py): (target, note, victim)."""
        driver, what = self.driver, kind.partition(":")[2]
        assert driver is not None, "scale faults need an autoscaled fleet"
        wait_s = self.config.recover_timeout_s
        if what == "up-during-redis-restart":
            started = driver.force_start(timeout_s=wait_s)
            self.services.kill_redis()
            time.sleep(self.rng.uniform(0.5, 3.0))
            self.services.start_redis()
            return started or "-", "Redis restarted empty while it started" if started \
                else "no slot to start", None
        if what == "supervisor-killed":
            mid = self.rng.choice(["start", "drain"])
            scaled = driver.force_start(timeout_s=wait_s) if mid == "start" else \
                (driver.force_drain(timeout_s=5.0, start_wait_s=wait_s) or (None,))[0]
            live = driver.kill_supervisor(self.watch, kind)
            return "supervisor", f"killed mid-{mid} of {scaled}; slots then: {live}", None
        drained = driver.force_drain(timeout_s=5.0, start_wait_s=wait_s)
        if drained is None:
            return "-", "no second running instance to drain", None
        target, held = drained
        note = f"drained with {held.load} requests running, waiting or assigned"
        if what == "down-under-load":
            return target, note, None
        time.sleep(self.rng.uniform(0.1, 1.0))  # engine-killed-draining: in its drain
        process = driver.draining_process(target)
        if process is None or process.poll() is not None:
            return target, note + "; stopped before the kill", None
        self.watch.signal_process(process, signal.SIGKILL, kind)
        return target, note + "; SIGKILLed while draining", process

    def wait_fleet_back(self, fault: Fault) -> float | None:
        """Seconds from the fault's end until the process it ended (if it ended one) was
        started again, every process runs, the API is ready and every engine has a fresh
        heartbeat (and a forced scale event is over: no slot starting or draining); None if
        that takes longer than the recovery timeout."""
        deadline = time.monotonic() + self.config.recover_timeout_s
        scale = fault.kind.startswith("scale:")
        while time.monotonic() < deadline:
            replaced = fault.victim is None or \
                self.stack.processes.get(fault.target) is not fault.victim
            settled = not scale or self.driver is None or self.driver.settled()
            if replaced and settled and self.watch.all_running() and self._api_ready() \
                    and self._engines_alive():
                return time.time() - fault.end
            time.sleep(0.1)
        return None

    def _api_ready(self) -> bool:
        try:
            return self.http.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    def _engines_alive(self) -> bool:
        engines = self.driver.running_engines() if self.driver is not None \
            else self.stack.settings.instance_ids
        keys = [f"blockq:instance:{i}:alive" for i in engines]
        if not keys:
            return False
        try:
            return self.redis.exists(*keys) == len(keys)
        except redis.RedisError:
            return False

    def close(self) -> None:
        self.redis.close()
        self.http.close()


def schedule_faults(kinds: list[str], per_kind: int, rng: random.Random) -> list[str]:
    """`per_kind` faults of each kind, in a shuffled order."""
    schedule = [kind for kind in kinds for _ in range(per_kind)]
    rng.shuffle(schedule)
    return schedule


def crash_faults(log_dir: Path) -> list[Fault]:
    """Every crash of the fault point, from the processes' JSON logs (a gunicorn worker's exit
    is not a process exit the watch sees: its master starts another)."""
    faults = []
    for path in sorted(log_dir.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if CRASH_AFTER_COMMIT_LINE not in line:
                continue
            try:
                at = datetime.fromisoformat(json.loads(line)["time"]).timestamp()
            except (ValueError, KeyError, TypeError):
                continue
            faults.append(Fault("crash-after-commit", path.stem, at, at))
    return faults
