"""A returning instance takes work at once: requests that wait, never started, in the engines of
its model's other instances go back to routing, where the policy spreads them over the fleet
with the returned instance among the candidates.

Why: after a crash the sweep re-routes the dead instance's requests at once, to the instances
alive at that moment. The restarted instance comes back seconds later, to an empty engine, while
the survivors hold the backlog in their engines' waiting queues; nothing routed later reaches
that backlog (a recovery run: of 100 requests in flight on two instances, the 50 re-routed all
waited on the survivor, and the last finished at 52.8 s instead of about 25 s).

An instance counts as returned for `window_s` after the sweep first sees its heartbeat again (or
at all); while it is idle (nothing running, waiting or assigned), the newest half of the requests
waiting unstarted in each other instance of its model (most backlogged first, up to the returned
instance's max_num_seqs) go back to routing. Only requests that are safe to
move go: not streamed (a stream's client may already hold its first bytes) and not started (no
first token, waiting in the engine as its last published state shows). A moved request is
requeued under the same fence as every re-route: its old engine aborts it at its next ownership
check, and the attempt check refuses whatever the old attempt writes; should it finish first,
the router finds it finished and does nothing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence

import redis

from app import dispatch, store
from app.fleet import InstanceStatus
from app.models import InferenceRequest, Priority, RequestStatus
from app.outbox import Outbox

__all__ = ["Rebalance", "RETURN_WINDOW_S"]

logger = logging.getLogger(__name__)

#: How long after it comes back an idle instance takes waiting work from the others.
RETURN_WINDOW_S = 30.0
_ALIVE_KEY = "blockq:rebalance:alive"
_RETURNED_KEY = "blockq:rebalance:returned"


class Rebalance:
    """One pass: note which instances came back, and move waiting work to the idle ones."""

    def __init__(self, outbox: Outbox, client: redis.Redis, *,
                 window_s: float = RETURN_WINDOW_S) -> None:
        self.outbox = outbox
        self.redis = client
        self.window_s = window_s

    def run(self, statuses: Sequence[InstanceStatus]) -> int:
        """The requests moved back to routing."""
        returned = self._returned(statuses)
        moved = 0
        for taker in statuses:
            if taker.instance_id in returned and _idle(taker):
                moved += self._take_for(taker, statuses)
        return moved

    def _returned(self, statuses: Sequence[InstanceStatus]) -> set[str]:
        """Instances that came back within the window (their heartbeat absent, or unknown,
        at the previous pass)."""
        now = time.time()
        alive = {s.instance_id for s in statuses if s.alive}
        previous = self.redis.get(_ALIVE_KEY)
        self.redis.set(_ALIVE_KEY, json.dumps(sorted(alive)))
        if previous is not None:
            back = alive - set(json.loads(previous))
            if back:
                self.redis.hset(_RETURNED_KEY, mapping=dict.fromkeys(back, now))
        marks = {_text(k): float(v) for k, v in self.redis.hgetall(_RETURNED_KEY).items()}
        expired = [i for i, at in marks.items() if now - at > self.window_s]
        if expired:
            self.redis.hdel(_RETURNED_KEY, *expired)
        return {i for i, at in marks.items() if now - at <= self.window_s} & alive

    def _take_for(self, taker: InstanceStatus, statuses: Sequence[InstanceStatus]) -> int:
        assert taker.state is not None
        donors = sorted((s for s in statuses if s.alive and s.state is not None
                         and s.instance_id != taker.instance_id
                         and s.model == taker.model and s.num_waiting > 0),
                        key=lambda s: -s.num_waiting)
        room = taker.state.max_num_seqs
        moved = 0
        for donor in donors:
            assert donor.state is not None
            # NOTE: the engine's waiting requests, newest last: the oldest keep their place.
            waiting = [r.request_id for r in donor.state.requests
                       if not r.is_running and r.num_computed_tokens == 0
                       and r.num_output_tokens == 0]
            for request_id in reversed(waiting[-(len(waiting) // 2 or 1):]):
                if moved >= room:
                    return moved
                moved += self._move(request_id, donor.instance_id, taker.instance_id)
        return moved

    def _move(self, request_id: str, donor: str, taker: str) -> int:
        with self.outbox.transaction() as tx:
            moved = store.transition_returning(
                tx.session, request_id, RequestStatus.QUEUED,
                allowed_from=(RequestStatus.ROUTED, RequestStatus.RUNNING),
                extra_where=[InferenceRequest.instance_id == donor,
                             InferenceRequest.stream.is_(False),
                             InferenceRequest.first_token_at.is_(None)],
                detail=f"requeued: waiting on {donor} while {taker} returned idle",
                returning=(InferenceRequest.priority,),
            )
            if moved is not None:
                tx.post(dispatch.route(request_id, priority=Priority(moved.priority).rank))
        if moved is None:
            return 0
        logger.info("rebalanced %s off %s (%s returned idle)", request_id, donor, taker)
        return 1


def _idle(status: InstanceStatus) -> bool:
    return (status.alive and status.accepting and status.state is not None
            and status.num_running == 0 and status.num_waiting == 0
            and status.num_assigned == 0)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
