"""A returning instance takes work at once: requests that wait, never started, in the engines of
its model's other instances go back to routing, where the policy spreads them over the fleet
with the returned instance among the candidates.

Why: after a crash the sweep re-routes the dead instance's requests at once, to the instances
alive at that moment. The restarted instance comes back seconds later, to an empty engine, while
the survivors hold the backlog in their engines' waiting queues; nothing routed later reaches
that backlog (a recovery run: of 100 requests in flight on two instances, the 50 re-routed all
waited on the survivor, and the last finished at 52.8 s instead of about 25 s).

An instance counts as returned for `window_s` after the sweep first sees its heartbeat again (or
at all); while it is idle (nothing running, waiting or assigned), it takes work from the other
instances of its model, decided by the what-if across the live pool: one request at a time, the
waiting, unstarted request whose simulated end-to-end latency drops most from where it waits (its
place in that engine's queue) to the returned instance (behind what that took already), for as
long as one gains. The what-ifs are the routing planner's own (`workers.route.policies.view_of`,
each instance's execution-time model), so the returned instance takes its share of the backlog,
not a fixed count. A moved request is routed to the returned instance directly (a new attempt,
assigned there, posted to its queue), not through the routing policy again: round robin, the bias
watch's fallback, sent half of the moved requests back where they came from (an engine restarted
into a backlog served 6 of about 100; the drain took 30.7 s against 20.6 s).

Without execution-time models, the newest half of the requests waiting unstarted in each other
instance (most backlogged first, up to the returned instance's max_num_seqs) go back to routing.

Only requests that are safe to move go: not streamed (a stream's client may already hold its
first bytes) and not started (no first token, waiting in the engine as its last published state
shows). A moved request is fenced as every re-route is: its old engine aborts it at its next
ownership check, and the attempt check refuses whatever the old attempt writes; should it finish
first, the move finds it finished and does nothing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import redis

from domain import dispatch, request_store
from domain.live_fleet import Fleet, InstanceStatus
from domain.models import InferenceRequest, Priority, RequestStatus, utcnow
from domain.outbox import Outbox
from workers.route.policies import view_of
from workers.sim.exec_model import ExecModel
from workers.sim.published import Published
from workers.sim.snapshot import InstanceSnapshot, SimRequest

__all__ = ["MAX_MOVES", "RETURN_WINDOW_S", "ExecModelsOf", "Rebalance"]

logger = logging.getLogger(__name__)

#: How long after it comes back an idle instance takes waiting work from the others.
RETURN_WINDOW_S = 30.0
#: Most requests one returned instance takes in one pass (each costs a what-if per donor).
MAX_MOVES = 256
#: The policy a moved request's row records.
POLICY = "rebalance"
_ALIVE_KEY = "blockq:rebalance:alive"
_RETURNED_KEY = "blockq:rebalance:returned"

#: Instance statuses -> each one's execution-time model, by instance id.
ExecModelsOf = Callable[[Sequence[InstanceStatus]], Mapping[str, ExecModel]]


class Rebalance:
    """One pass: note which instances came back, and move waiting work to the idle ones."""

    def __init__(self, outbox: Outbox, client: redis.Redis, *,
                 window_s: float = RETURN_WINDOW_S, fleet: Fleet | None = None,
                 exec_models: ExecModelsOf | None = None) -> None:
        """With `fleet` and `exec_models`, moves by the what-if (module docstring)."""
        self.outbox = outbox
        self.redis = client
        self.window_s = window_s
        self.fleet = fleet
        self.exec_models = exec_models

    def run(self, statuses: Sequence[InstanceStatus]) -> int:
        """The requests moved back to routing."""
        returned = self._returned(statuses)
        moved = 0
        for taker in statuses:
            if taker.instance_id in returned and _idle(taker):
                moved += (self._take_by_what_if(taker, statuses)
                          if self.exec_models is not None and self.fleet is not None
                          else self._take_for(taker, statuses))
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

    def _take_by_what_if(self, taker: InstanceStatus,
                         statuses: Sequence[InstanceStatus]) -> int:
        """Move, one at a time, the waiting request that gains most by running on `taker`
        (module docstring); how many moved."""
        pool = [s for s in statuses if s.alive and s.state is not None and s.model == taker.model]
        donors = [s.instance_id for s in pool
                  if s.instance_id != taker.instance_id and s.num_waiting > 0]
        if not donors:
            return 0
        assert self.exec_models is not None
        plan = WhatIfPlan({s.instance_id: s.published() for s in pool}, self.exec_models(pool),
                          taker.instance_id)
        moved = 0
        while moved < MAX_MOVES and (best := plan.best_move(donors)) is not None:
            plan.apply(best)
            moved += self._assign(best, taker.instance_id)
        return moved

    def _assign(self, move: Move, taker: str) -> int:
        """Route the moved request to `taker`: a new attempt there and its generate message on
        the taker's queue (one transaction), then its assignment (what routing does)."""
        assert self.fleet is not None
        request = move.request
        with self.outbox.transaction() as tx:
            routed = request_store.transition_returning(
                tx.session, request.request_id, RequestStatus.ROUTED,
                allowed_from=(RequestStatus.ROUTED, RequestStatus.RUNNING),
                extra_where=[InferenceRequest.instance_id == move.donor,
                             InferenceRequest.stream.is_(False),
                             InferenceRequest.first_token_at.is_(None)],
                detail=f"{POLICY}: waiting on {move.donor}, moved to {taker} returned idle "
                       f"(what-if e2e {move.stay_s:.2f} -> {move.go_s:.2f} s)",
                instance_id=taker, policy=POLICY, predicted_e2e_s=move.go_s,
                routed_at=utcnow(), attempt=InferenceRequest.attempt + 1,
                returning=(InferenceRequest.attempt, InferenceRequest.priority))
            if routed is not None:
                rank = Priority(routed.priority).rank
                tx.post(dispatch.generate(request.request_id, instance_id=taker,
                                          attempt=int(routed.attempt), priority=rank))
        if routed is None:
            return 0
        self.fleet.assign(taker, request.request_id, num_prompt_tokens=request.num_prompt_tokens,
                          predicted_output_tokens=request.predicted_output_tokens,
                          priority_class=rank)
        logger.info("rebalanced %s off %s to %s (what-if e2e %.2f -> %.2f s)",
                    request.request_id, move.donor, taker, move.stay_s, move.go_s)
        return 1

    def _move(self, request_id: str, donor: str, taker: str) -> int:
        with self.outbox.transaction() as tx:
            moved = request_store.transition_returning(
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


@dataclass(frozen=True, slots=True)
class Move:
    """One waiting request to move from `donor` to the returned instance."""

    donor: str
    request: SimRequest
    #: What-if end-to-end seconds of the request where it waits, and on the returned instance.
    stay_s: float
    go_s: float


class WhatIfPlan:
    """The pool as the moves so far leave it (pure): each instance's published state, less the
    requests moved off it, the taker's plus those moved onto it (queued last, as routed ones
    are)."""

    def __init__(self, published: dict[str, Published], models: Mapping[str, ExecModel],
                 taker: str) -> None:
        self.published, self.models, self.taker = dict(published), models, taker

    def best_move(self, donors: Sequence[str]) -> Move | None:
        """Of each donor's newest waiting, unstarted request (the oldest keep their place in
        line), the one whose what-if gains most on the taker; None when none gains."""
        best: Move | None = None
        for donor in donors:
            waiting = [r for r in self.published[donor].snapshot.requests if _movable(r)]
            if not waiting:
                continue
            request = waiting[-1]
            stay_s = self._e2e(donor, request, leaving=True)
            go_s = self._e2e(self.taker, request)
            if go_s < stay_s and (best is None or stay_s - go_s > best.stay_s - best.go_s):
                best = Move(donor, request, stay_s, go_s)
        return best

    def apply(self, move: Move) -> None:
        donor, taker = self.published[move.donor], self.published[self.taker]
        self.published[move.donor] = _without(donor, move.request.request_id)
        self.published[self.taker] = Published(taker.snapshot, (*taker.assigned, move.request),
                                               taker.capacity_rps)

    def _e2e(self, instance_id: str, request: SimRequest, *, leaving: bool = False) -> float:
        """The request's what-if end-to-end seconds on the instance as a new arrival; on its
        own instance (`leaving`), in its place: from the instance's state without it."""
        published = self.published[instance_id]
        if leaving:
            published = _without(published, request.request_id)
        _, what_if = view_of(instance_id, published, request, self.models[instance_id])
        assert what_if is not None
        return what_if.e2e_s


def _movable(request: SimRequest) -> bool:
    return (not request.is_running and request.num_computed_tokens == 0
            and request.num_output_tokens == 0)


def _without(published: Published, request_id: str) -> Published:
    snapshot = published.snapshot
    return Published(InstanceSnapshot(snapshot.config, snapshot.num_free_blocks,
                                      tuple(r for r in snapshot.requests
                                            if r.request_id != request_id),
                                      snapshot.cached_prefixes),
                     published.assigned, published.capacity_rps)


def _idle(status: InstanceStatus) -> bool:
    return (status.alive and status.accepting and status.state is not None
            and status.num_running == 0 and status.num_waiting == 0
            and status.num_assigned == 0)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
