"""The state publisher of an engine instance: its snapshot and heartbeat in Redis, every
`state_publish_interval_s`, and the cancellations it finds there applied to the engine.

The heartbeat says that the engine loop runs, not just that the worker process does: once the
engine died, the publisher drops the heartbeat, so routers stop choosing the instance and the
orphan sweep re-routes the requests it held (the engine contract: such requests run elsewhere).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis

from domain.live_fleet import Fleet
from workers.serve.engine import Engine
from workers.serve.periodic import Periodic
from workers.sim.engine_state import Declared, EngineState

__all__ = ["StatePublisher"]

logger = logging.getLogger(__name__)

#: How long stop() waits for a publish in progress.
JOIN_TIMEOUT_S = 5.0


class StatePublisher:
    """Publishes what the engine holds so that routers see it, and aborts what was cancelled."""

    def __init__(self, instance_id: str, declared: Declared, engine: Engine, fleet: Fleet,
                 interval_s: float, on_room: Callable[[], None] | None = None) -> None:
        """`on_room`: called after a publication that shows room (nothing waiting, seats
        free) while the router holds requests (late binding: it sends the release task)."""
        self.instance_id = instance_id
        self.declared = declared  # what the instance serves, in every state it publishes
        self.engine = engine
        self.fleet = fleet
        self.on_room = on_room
        self.accepting = True  # False once the instance withdraws: route nothing new to it
        self._thread = Periodic(f"{instance_id}-publisher", interval_s, self.publish_once,
                                "state publish failed on %s", instance_id)

    def start(self) -> None:
        """Publish now, then every interval. Redis out of reach now does not stop the start:
        the instance is announced by the first publication that reaches it (routers cannot
        see it before anyway). An engine worker restarted while Redis restarted used to exit
        here, found by the chaos run."""
        self._tolerating_redis(self.publish_once, "first publication")
        self._thread.start()

    def withdraw(self) -> None:
        """Tell routers at once that this instance takes no new work; the heartbeat goes on."""
        self.accepting = False
        self._tolerating_redis(self.publish_once, "withdrawal")

    def signal_stop(self) -> None:
        """Stop publishing and drop the heartbeat (routers re-route what is left here; with
        Redis out of reach, once the heartbeat's TTL has run out)."""
        self.accepting = False
        self._thread.signal_stop()
        self._tolerating_redis(lambda: self.fleet.mark_stopped(self.instance_id), "stop")

    def _tolerating_redis(self, action: Callable[[], None], what: str) -> None:
        try:
            action()
        except redis.RedisError as exc:
            logger.warning("state %s of %s not published: Redis unreachable (%s)", what,
                           self.instance_id, type(exc).__name__)

    def join(self) -> None:
        self._thread.join(JOIN_TIMEOUT_S)

    def publish_once(self) -> None:
        if not self.engine.alive:
            self._drop_heartbeat()
            return
        state = self.engine.snapshot().published(self.instance_id, self.declared,
                                                 accepting=self.accepting)
        num_held = self.fleet.publish(self.instance_id, state)
        in_flight = [r.request_id for r in state.requests]
        for request_id in self.fleet.cancelled(in_flight):
            self.engine.abort(request_id)
        if num_held and self.on_room is not None and _has_room(state):
            self.on_room()

    def _drop_heartbeat(self) -> None:
        if self.accepting:
            logger.error("the engine of %s is not running: heartbeat dropped, its requests go "
                         "to other instances", self.instance_id)
        self.accepting = False
        self.fleet.mark_stopped(self.instance_id)


def _has_room(state: EngineState) -> bool:
    """Nothing waiting in the engine and a seat free: it could start a request now."""
    return state.accepting and state.num_waiting == 0 and state.num_running < state.max_num_seqs
