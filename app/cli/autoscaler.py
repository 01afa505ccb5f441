"""The local stack's autoscaler (`blockq serve` with BLOCKQ_AUTOSCALE=true): every
autoscale_interval_s it runs the decision (workers/autoscale/decide.py) over the whole fleet and
starts or drains engine workers to match.

Each fleet slot (instance gpu.<k>, domain/settings.py) is stopped, starting, running or draining:

- **Start**: the slot's operator hold is cleared (a drained slot restarted must take work) and
  the stack starts its engine worker under supervision; a worker that exits while starting is
  restarted by the supervisor with its doubling backoff, and each failure is reported. The
  routing never waits on it: routers choose only instances whose heartbeat is fresh. Its cold
  start is measured and reported: process start to ready (heartbeat), of which the model load
  (the engine host's log), and its first token.
- **Drain, then stop**: the instance is held "scaling_down" (routers stop choosing it, as after
  the admin drain), its engine's waiting, unstarted, non-streamed requests go back to routing at
  every round, its running requests finish; once it holds nothing and its queue is empty it gets
  SIGTERM, Celery's warm shutdown. A drain past autoscale_drain_timeout_s is reported (log and
  Redis) and waits on: nothing is killed mid-answer (an operator who must can SIGKILL the pid
  the report names, or `blockq stop`). The hold is the autoscaler's own: one started after its
  predecessor died mid-drain releases it (the stack started that engine again, and the decision
  drains it again if it is still surplus), where a leftover hold would leave a running engine
  that no router chooses, counted as capacity.

Without a stack (`blockq autoscale`, for Kubernetes) it only decides and records: KEDA or an HPA
scales the engine Deployments on blockq_desired_instances (docker/kubernetes, docs/deploy.md),
and a slot counts as running while its heartbeat is fresh.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import redis
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from app.cli.stack import Stack, process_commands
from domain.autoscale_record import record_decision
from domain.celery_app import create_celery
from domain.controls import SCALING_DOWN, OperatorControls
from domain.db import Database
from domain.live_fleet import Fleet, InstanceStatus
from domain.models import InferenceRequest
from domain.outbox import Outbox
from domain.queues import queue_depths
from domain.settings import Settings
from workers.autoscale.decide import (
    AutoscalePolicy,
    Autoscaler,
    EntryState,
    ModelDecision,
    SaturationSizer,
    Sizer,
)
from workers.autoscale.demand import (
    late_batch_rps,
    recent_arrivals,
    requeue_waiting,
    waiting_by_model,
)
from workers.sim.fleet_declaration import FleetSlot

__all__ = ["COLD_STARTS_KEY", "DRAIN_REPORTS_KEY", "StackAutoscaler", "policy_of"]

logger = logging.getLogger("blockq.autoscale")

#: Redis list of the last cold starts (JSON, newest first).
COLD_STARTS_KEY = "blockq:autoscale:cold_starts"
#: Redis list of drains that passed their timeout and of failed starts (JSON, newest first).
DRAIN_REPORTS_KEY = "blockq:autoscale:reports"
_KEEP_REPORTS = 200
_LOADED = re.compile(r"engine (\S+) loaded in ([0-9.]+) s")

Phase = Literal["stopped", "starting", "running", "draining"]


def policy_of(settings: Settings) -> AutoscalePolicy:
    """The decision's knobs from the settings: the forecast looks one interval and the longest
    cold start ahead."""
    start_s = max((e.start_s or settings.emulated_start_s) * settings.emulated_time_scale
                  for e in settings.fleet) if settings.fleet else 0.0
    return AutoscalePolicy(
        headroom=settings.autoscale_headroom, window_s=settings.autoscale_window_s,
        # NOTE: the last minute and 10 s buckets of the default 300 s window, shorter in
        # proportion for a shorter one (a benchmark's compressed day).
        recent_s=min(60.0, settings.autoscale_window_s / 5),
        bucket_s=min(10.0, settings.autoscale_window_s / 30),
        horizon_s=settings.autoscale_interval_s + start_s,
        scale_down_after_s=settings.autoscale_scale_down_after_s)


@dataclass
class _Slot:
    """One instance the fleet may run, as the autoscaler drives it."""

    slot: FleetSlot
    phase: Phase = "stopped"
    since: float = 0.0  # monotonic: when it entered its phase
    started_at: float = 0.0  # Unix time of its last start
    restarts_at_start: int = 0  # the supervisor's restart count when it was started
    process: subprocess.Popen[bytes] | None = None  # while draining (the stack let it go)
    reported: bool = False  # its drain's timeout, or its start's failure, was reported
    ready_s: float | None = None  # its last cold start, start to heartbeat
    awaiting_first_token: bool = False

    @property
    def instance_id(self) -> str:
        return self.slot.instance_id


class StackAutoscaler:
    """Decides every interval and drives the stack's engine workers to the decision."""

    def __init__(self, stack: Stack | None, settings: Settings, *, sizer: Sizer | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.stack = stack
        self.settings = settings
        self.clock = clock
        self.db = Database(settings.resolved_database_url)
        self.redis = redis.Redis.from_url(settings.redis_url)
        self.fleet = Fleet(self.redis, heartbeat_ttl_s=settings.heartbeat_ttl_s)
        self.outbox = Outbox(self.db, create_celery(settings))
        self.controls = OperatorControls(self.db, self.fleet)
        emulated = all(spec.engine == "emulated" for spec in settings.instances)
        self.scaler = Autoscaler(policy_of(settings), sizer or SaturationSizer(
            max_model_len=settings.max_model_len, policy_alike=settings.routing_policy,
            policy_mixed=settings.mixed_fleet_routing_policy,
            time_scale=settings.emulated_time_scale if emulated else 1.0))
        self.prices = settings.gpu_prices
        self.commands = process_commands(settings)
        now = time.monotonic()
        # NOTE: the stack started the first `count` of each entry already (their start was
        # not this autoscaler's to measure).
        self.slots = {s.instance_id: _Slot(s, "running" if s.starts_running else "stopped",
                                           now, clock())
                      for s in settings.fleet_slots}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        if stack is not None:
            self._release_leftover_holds()

    @property
    def _stack(self) -> Stack:
        assert self.stack is not None, "acting needs the local stack"
        return self.stack

    # --- the loop -----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="blockq-autoscaler",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the loop; instances being drained get their warm shutdown now."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        for slot in self.slots.values():
            if slot.phase == "draining" and slot.process is not None:
                slot.process.send_signal(signal.SIGTERM)
        for slot in self.slots.values():
            if slot.phase == "draining" and slot.process is not None:
                slot.process.wait()
        self.db.dispose()

    def run(self) -> None:
        """Decide every interval in this thread until `stop()` (or an interrupt)."""
        self._loop()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self.step()
            except (redis.RedisError, SQLAlchemyError) as exc:
                logger.warning("autoscaler: round skipped (%s: %s)", type(exc).__name__, exc)
            self._stopping.wait(max(0.0, self.settings.autoscale_interval_s
                                    - (time.monotonic() - started)))

    def step(self) -> list[ModelDecision]:
        """One round: follow every slot, decide, act. Public for tests and benchmarks."""
        self.follow()
        now = self.clock()
        history = recent_arrivals(self.db, now - self.settings.autoscale_window_s,
                                  self.settings.default_model)
        decisions = self.scaler.decide(now, self._entries(), history, waiting_by_model(self.db),
                                       late_batch_rps(self.db, self.redis, now,
                                                      self.settings.default_model))
        for decision in decisions:
            self._apply(decision)
        return decisions

    def follow(self) -> None:
        """Follow every slot: starts that became ready, drains that can stop (or overran)."""
        statuses = {s.instance_id: s for s in self.fleet.statuses()}
        for slot in self.slots.values():
            if self.stack is None:  # the orchestrator acts: follow the heartbeats
                status = statuses.get(slot.instance_id)
                slot.phase = "running" if status is not None and status.alive else "stopped"
            else:
                self._follow(slot, statuses.get(slot.instance_id))

    def drain(self, instance_id: str) -> None:
        """Drain one running instance now, then stop it (what a scale-down does; `follow`
        carries it on)."""
        slot = self.slots[instance_id]
        if slot.phase not in ("starting", "running"):
            raise ValueError(f"{instance_id} is {slot.phase}: only a live instance drains")
        self._drain(slot)

    def start_instance(self, instance_id: str) -> None:
        """Start one stopped slot now (what a scale-up does; `follow` carries it on): an
        operator's hook, and the chaos harness's."""
        slot = self.slots[instance_id]
        if slot.phase != "stopped":
            raise ValueError(f"{instance_id} is {slot.phase}: only a stopped slot starts")
        self._start(slot)

    # --- deciding -----------------------------------------------------------------------------
    def _entries(self) -> list[EntryState]:
        entries = []
        for index, declared in enumerate(self.settings.fleet):
            slots = [s for s in self.slots.values() if s.slot.entry_index == index]
            spec = slots[0].slot.spec if slots else declared
            entries.append(EntryState(
                index, declared.model, self._kind(index), spec.exec_model or "",
                declared.lowest_count, declared.highest_count,
                sum(1 for s in slots if s.phase in ("starting", "running")),
                self.prices.get(declared.gpu_kind) if declared.gpu_kind else None,
                spec.num_blocks, spec.max_num_seqs))
        return entries

    def _kind(self, entry_index: int) -> str:
        entry = self.settings.fleet[entry_index]
        return entry.gpu_kind or self.settings.instances[
            next(s.index for s in self.settings.fleet_slots
                 if s.entry_index == entry_index)].exec_model or "unknown"

    def _apply(self, decision: ModelDecision) -> None:
        log = logger.info if decision.action != "hold" else logger.debug
        log("autoscale %s: %s", decision.model, decision.reason)
        by_kind: dict[str, int] = {}
        for index, count in decision.desired.items():
            by_kind[self._kind(index)] = by_kind.get(self._kind(index), 0) + count
        record_decision(self.redis, decision.model, decision.action, by_kind, {
            "at": self.clock(), "action": decision.action, "reason": decision.reason,
            "rate_rps": decision.rate_rps, "target_rps": decision.target_rps,
            "predicted_ttft_p99_s": decision.predicted_ttft_p99_s,
            "cost_per_hour": decision.cost_per_hour})
        if self.stack is None:
            return
        for index, wanted in decision.desired.items():
            slots = sorted((s for s in self.slots.values() if s.slot.entry_index == index),
                           key=lambda s: s.slot.index)
            active = [s for s in slots if s.phase in ("starting", "running")]
            for slot in [s for s in slots if s.phase == "stopped"][:max(0, wanted - len(active))]:
                self._start(slot)
            # Fewer: the newest first, a starting one (no work yet) before a running one.
            surplus = sorted(active, key=lambda s: (s.phase == "starting", s.slot.index),
                             reverse=True)[:max(0, len(active) - wanted)]
            for slot in surplus:
                self._drain(slot)

    # --- acting -------------------------------------------------------------------------------
    def _start(self, slot: _Slot) -> None:
        self.controls.hold(slot.instance_id, None)
        self._stack.start_process(slot.instance_id, self.commands[slot.instance_id])
        slot.phase, slot.since, slot.started_at = "starting", time.monotonic(), self.clock()
        slot.restarts_at_start = self._stack.restart_count(slot.instance_id)
        slot.reported, slot.ready_s = False, None
        logger.info("autoscale: starting %s (%s)", slot.instance_id, slot.slot.spec.model)

    def _release_leftover_holds(self) -> None:
        """Release the scale-down holds of an autoscaler that died mid-drain (an operator's
        holds stay)."""
        for instance_id, control in self.controls.held().items():
            if control == SCALING_DOWN and instance_id in self.slots:
                self.controls.hold(instance_id, None)
                logger.info("autoscale: released %s's scale-down hold, left by a drain that "
                            "did not end", instance_id)

    def _drain(self, slot: _Slot) -> None:
        self.controls.hold(slot.instance_id, SCALING_DOWN)
        slot.process = self._stack.release(slot.instance_id)
        slot.phase, slot.since, slot.reported = "draining", time.monotonic(), False
        logger.info("autoscale: draining %s (%s)", slot.instance_id, slot.slot.spec.model)

    def _follow(self, slot: _Slot, status: InstanceStatus | None) -> None:
        if slot.phase == "starting":
            self._follow_start(slot, status)
        elif slot.phase == "draining":
            self._follow_drain(slot, status)
        if slot.awaiting_first_token:
            self._follow_first_token(slot)

    def _follow_start(self, slot: _Slot, status: InstanceStatus | None) -> None:
        restarts = self._stack.restart_count(slot.instance_id) - slot.restarts_at_start
        if restarts and not slot.reported:
            slot.reported = True
            self._report({"event": "start_failed", "instance_id": slot.instance_id,
                          "restarts": restarts})
            logger.warning("autoscale: %s failed to start (restart %d; the supervisor retries "
                           "with backoff; log: %s)", slot.instance_id, restarts,
                           self._stack.log_dir / f"{slot.instance_id}.log")
        # NOTE: a heartbeat from before this start (a stopped worker's, until its TTL) is not
        # this start's: the state must be published after it.
        published_at = status.state.published_at if status and status.state else None
        if status is None or not status.alive or not status.accepting or (
                published_at is None or published_at < slot.started_at):
            return
        slot.phase, slot.ready_s = "running", time.monotonic() - slot.since
        slot.since, slot.awaiting_first_token = time.monotonic(), True
        load_s = self._model_load_s(slot.instance_id)
        logger.info("autoscale: %s ready after %.2f s (model load %s)", slot.instance_id,
                    slot.ready_s, f"{load_s:.2f} s" if load_s is not None else "unknown")

    def _follow_first_token(self, slot: _Slot) -> None:
        since = datetime.fromtimestamp(slot.started_at, UTC)
        with self.db.session() as session:
            first = session.scalar(select(func.min(InferenceRequest.first_token_at)).where(
                InferenceRequest.instance_id == slot.instance_id,
                InferenceRequest.first_token_at >= since))
        if first is None:
            return
        slot.awaiting_first_token = False
        record = {"instance_id": slot.instance_id, "model": slot.slot.spec.model,
                  "gpu_kind": self._kind(slot.slot.entry_index), "ready_s": slot.ready_s,
                  "model_load_s": self._model_load_s(slot.instance_id),
                  "first_token_s": first.timestamp() - slot.started_at,
                  "started_at": slot.started_at}
        self.redis.lpush(COLD_STARTS_KEY, json.dumps(record))
        self.redis.ltrim(COLD_STARTS_KEY, 0, _KEEP_REPORTS - 1)
        logger.info("autoscale: cold start of %s: ready %.2f s, first token %.2f s after its "
                    "start", slot.instance_id, slot.ready_s or 0.0, record["first_token_s"])

    def _follow_drain(self, slot: _Slot, status: InstanceStatus | None) -> None:
        process = slot.process
        if process is None or process.poll() is not None:
            self.controls.hold(slot.instance_id, None)
            slot.phase, slot.process, slot.since = "stopped", None, time.monotonic()
            logger.info("autoscale: %s stopped", slot.instance_id)
            return
        if status is not None and status.alive:
            requeue_waiting(self.outbox, status)
        if self._idle(slot.instance_id, status):
            process.send_signal(signal.SIGTERM)  # warm shutdown: nothing left to finish
            return
        waited_s = time.monotonic() - slot.since
        if waited_s > self.settings.autoscale_drain_timeout_s and not slot.reported:
            slot.reported = True
            running = status.num_running if status is not None else None
            self._report({"event": "drain_timeout", "instance_id": slot.instance_id,
                          "pid": process.pid, "waited_s": waited_s, "running": running})
            logger.warning("autoscale: drain of %s (pid %d) past %.0f s with %s requests "
                           "running; it goes on (nothing is killed mid-answer)",
                           slot.instance_id, process.pid, waited_s, running)

    def _idle(self, instance_id: str, status: InstanceStatus | None) -> bool:
        if status is not None and status.alive and (
                status.num_running or status.num_waiting or status.num_assigned):
            return False
        if self.settings.broker_is_rabbitmq:
            return status is not None and status.alive  # queue depth not readable here
        depths = queue_depths(self.redis, [instance_id])
        return not sum(depths.get(instance_id, {}).values())

    def _model_load_s(self, instance_id: str) -> float | None:
        log = self._stack.log_dir / f"{instance_id}.log"
        try:
            matches = _LOADED.findall(log.read_text(errors="replace")[-200_000:])
        except OSError:
            return None
        return float(matches[-1][1]) if matches else None

    def _report(self, record: dict[str, object]) -> None:
        self.redis.lpush(DRAIN_REPORTS_KEY, json.dumps({"at": self.clock(), **record}))
        self.redis.ltrim(DRAIN_REPORTS_KEY, 0, _KEEP_REPORTS - 1)
