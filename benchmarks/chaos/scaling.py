"""Scale events on an autoscaled fleet (RunConfig.autoscale): the local stack's autoscaler runs
as `blockq serve` runs it, and the fault injector forces scale events through the autoscaler's
operator hooks (`StackAutoscaler.drain`, `StackAutoscaler.start_instance`):

- `scale:down-under-load`: the busiest running engine is drained (waiting requests go back to
  routing, running ones finish, then it stops);
- `scale:up-during-redis-restart`: a stopped slot is started, and Redis is killed and started
  again empty while the instance starts;
- `scale:supervisor-killed`: a start or a drain is begun, then the supervisor dies; the stack
  dies whole and the harness starts it again (below);
- `scale:engine-killed-draining`: the busiest running engine is drained, and SIGKILLed while it
  drains.

NOTE: the harness is the stack's supervisor (the stack runs in this process, as the rest of the
harness needs its processes' handles), so its death is reproduced rather than sent: what the
kernel does when a supervisor is SIGKILLed (every process the supervisor started gets
PARENT_DEATH_SIGNAL, SIGTERM: app/cli/stack.py), and what the supervisor loses (the autoscaler's
memory: which slot was starting or draining). The stack is then started again from its settings,
as an operator's restart loop starts `blockq serve`, with a new autoscaler.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis
from sqlalchemy.exc import SQLAlchemyError

from app.cli.autoscaler import StackAutoscaler
from app.cli.stack import PARENT_DEATH_SIGNAL, Stack, StackError
from benchmarks.chaos.processes import ProcessWatch
from domain.settings import Settings

logger = logging.getLogger(__name__)

#: The scale fault kinds (only on an autoscaled fleet).
SCALE_KINDS = ["scale:down-under-load", "scale:up-during-redis-restart",
               "scale:supervisor-killed", "scale:engine-killed-draining"]


#: How long the processes of a dead supervisor get for their warm shutdown before the harness
#: presses them: an engine's finishes its running requests (seconds at the run's time scale).
KILL_GRACE_S = 20.0


#: How long the harness tries to start the stack again while the old one's last processes
#: still hold the data directory.
RESTART_WAIT_S = 30.0


@dataclass(frozen=True)
class SlotView:
    """One fleet slot as the injector chooses among them."""

    instance_id: str
    phase: str  # stopped, starting, running, draining
    load: int = 0  # requests running, waiting and assigned on it (0: unknown)


def drain_target(slots: Sequence[SlotView]) -> str | None:
    """The running instance a forced scale-down drains: the busiest (a drain with requests
    waiting and running), the newest slot on a tie; None where that would leave no instance
    running."""
    running = [s for s in slots if s.phase == "running"]
    if len(running) < 2:
        return None
    return max(running, key=lambda s: (s.load, _slot_number(s.instance_id))).instance_id


def start_target(slots: Sequence[SlotView]) -> str | None:
    """The stopped slot a forced scale-up starts: the lowest; None when every slot is live."""
    stopped = [s for s in slots if s.phase == "stopped"]
    return min(stopped, key=lambda s: _slot_number(s.instance_id)).instance_id \
        if stopped else None


def _slot_number(instance_id: str) -> int:
    return int(instance_id.rpartition(".")[2])


class ScaleDriver:
    """Runs the stack's autoscaler (every autoscale_interval_s, in a thread) and forces scale
    events between its rounds."""

    def __init__(self, stack: Stack, settings: Settings, names: list[str]) -> None:
        self.stack, self.settings, self.names = stack, settings, names
        self.lock = threading.RLock()  # a round, or a forced event, at a time
        self.errors: list[str] = []  # rounds that raised something else than an outage
        self.restarts = 0  # stack restarts after a supervisor's death
        self.events: Counter[str] = Counter()  # starts and drains begun, by whom
        self._log_offsets: dict[str, int] = {}  # restarted workers: their logs' size before
        self.autoscaler = StackAutoscaler(stack, settings)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the autoscaler's loop ----------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="chaos-autoscaler", daemon=True)
        self._thread.start()

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def stop(self) -> None:
        """End the loop; drains in progress get their warm shutdown (as `blockq serve` does)."""
        self._halt()
        self.autoscaler.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self.lock:
                before = self._phases()
                try:
                    self.autoscaler.step()
                except (redis.RedisError, SQLAlchemyError):
                    pass  # Redis or PostgreSQL down: `blockq serve` skips the round too
                except Exception as exc:  # noqa: BLE001 - a finding, not the run's end
                    logger.exception("autoscaler round failed")
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                self._count("autoscaler", before)
            self._stop.wait(self.settings.autoscale_interval_s)

    def _phases(self) -> dict[str, str]:
        return {i: s.phase for i, s in self.autoscaler.slots.items()}

    def _count(self, by: str, before: dict[str, str]) -> None:
        """Counts the starts and drains begun since `before` (the phases then)."""
        for instance_id, phase in self._phases().items():
            if phase != before.get(instance_id) and phase in ("starting", "draining"):
                self.events[f"{by} {'starts' if phase == 'starting' else 'drains'}"] += 1

    # --- what the injector sees ---------------------------------------------------------------
    def views(self) -> list[SlotView]:
        """Every slot's phase, and its load where Redis answers."""
        try:
            statuses = {s.instance_id: s for s in self.autoscaler.fleet.statuses()}
        except redis.RedisError:
            statuses = {}
        views = []
        for instance_id, slot in self.autoscaler.slots.items():
            status = statuses.get(instance_id)
            load = (status.num_running + status.num_waiting + status.num_assigned
                    if status is not None and status.alive else 0)
            views.append(SlotView(instance_id, slot.phase, load))
        return views

    def settled(self) -> bool:
        """No slot is starting or draining, and every Celery worker started again after the
        supervisor's death has logged that it is ready (it consumes)."""
        return all(s.phase in ("stopped", "running") for s in self.autoscaler.slots.values()) \
            and self._workers_ready()

    def _workers_ready(self) -> bool:
        for name, offset in list(self._log_offsets.items()):
            try:
                with (self.stack.log_dir / f"{name}.log").open("rb") as log:
                    log.seek(offset)
                    if b" ready." not in log.read():
                        return False
            except OSError:
                return False
            del self._log_offsets[name]
        return True

    def running_engines(self) -> list[str]:
        """The engines that must have a heartbeat: those the stack runs, not starting."""
        starting = {i for i, s in self.autoscaler.slots.items() if s.phase == "starting"}
        return [n for n in self.stack.processes
                if n in self.settings.instance_ids and n not in starting]

    # --- forced events ------------------------------------------------------------------------
    def force_drain(self, timeout_s: float, start_wait_s: float = 0.0
                    ) -> tuple[str, SlotView] | None:
        """Drains the busiest running engine (if it is the only one, starting another first
        and waiting up to `start_wait_s` for it; then up to `timeout_s` for one with work);
        (its id, what it held)."""
        if drain_target(self.views()) is None and self.force_start() is not None:
            self._until(lambda: drain_target(self.views()) is not None,
                        time.monotonic() + start_wait_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            views = self.views()
            target = drain_target(views)
            if target is not None and next(v for v in views if v.instance_id == target).load:
                break
            time.sleep(0.1)
        with self.lock:
            views = self.views()
            target = drain_target(views)
            if target is None:
                return None
            self.autoscaler.drain(target)
            self.events["forced drains"] += 1
            return target, next(v for v in views if v.instance_id == target)

    def force_start(self, timeout_s: float = 0.0) -> str | None:
        """Starts the lowest stopped slot (draining one first if none is stopped and waiting
        up to `timeout_s` for it to stop); its id."""
        if start_target(self.views()) is None and timeout_s > 0 and self.force_drain(0) is not None:
            self._until(lambda: start_target(self.views()) is not None,
                        time.monotonic() + timeout_s)
        with self.lock:
            target = start_target(self.views())
            if target is not None:
                self.autoscaler.start_instance(target)
                self.events["forced starts"] += 1
            return target

    def draining_process(self, instance_id: str) -> subprocess.Popen[bytes] | None:
        slot = self.autoscaler.slots[instance_id]
        return slot.process if slot.phase == "draining" else None

    def kill_supervisor(self, watch: ProcessWatch, cause: str) -> str:
        """The supervisor dies now (its death reproduced: module docstring); the stack is
        started again. What was live, for the fault's note."""
        self._halt()
        with self.lock:
            phases = {i: s.phase for i, s in self.autoscaler.slots.items() if s.phase != "stopped"}
            draining = [s.process for s in self.autoscaler.slots.values()
                        if s.phase == "draining" and s.process is not None]
            for process in [*self.stack.processes.values(), *draining]:
                watch.expect(process.pid, cause)
            for process in draining:
                if process.poll() is None:
                    process.send_signal(PARENT_DEATH_SIGNAL)
            # PARENT_DEATH_SIGNAL to each and their warm shutdowns; those still up after
            # KILL_GRACE_S are pressed (SIGQUIT, SIGKILL), as `blockq stop` presses orphans
            # before the supervisor can start again on the data directory.
            self.stack.stop(timeout_s=KILL_GRACE_S)
            for process in draining:
                process.wait()
            self.autoscaler.db.dispose()  # its memory is gone with it
            self.restarts += 1
            initial = set(self.settings.initial_instance_ids)
            instances = set(self.settings.instance_ids)
            names = [n for n in self.names if n not in instances or n in initial]
            self._log_offsets = {n: self._log_size(n) for n in names
                                 if n not in ("api", "beat")}  # the Celery workers
            self._start_again(names)
            self.stack.supervise()
            self.autoscaler = StackAutoscaler(self.stack, self.settings)
        self.start()
        return ", ".join(f"{i} {p}" for i, p in sorted(phases.items()))

    def _start_again(self, names: list[str]) -> None:
        """Starts the stack again once the data directory's lock is free: a dead stack's last
        holders (gunicorn's workers, after their master) may take a moment to exit."""
        deadline = time.monotonic() + RESTART_WAIT_S
        while True:
            try:
                self.stack.start(names=names)
                return
            except StackError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _log_size(self, name: str) -> int:
        try:
            return (self.stack.log_dir / f"{name}.log").stat().st_size
        except OSError:
            return 0

    @staticmethod
    def _until(check: Callable[[], bool], deadline: float) -> None:
        while time.monotonic() < deadline and not check():
            time.sleep(0.1)
