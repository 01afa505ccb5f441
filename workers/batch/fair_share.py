"""Fair sharing of batch slots among teams: which batches get the free slots now. Pure: no I/O.

The releaser keeps at most `max_batch_in_flight` batch requests in the pipeline. Each free slot
goes, one at a time, to the team with the least work in flight per unit of its `share` (among
teams with lines waiting), and within that team to its batch with the earliest deadline (its
completion window's end; the oldest on ties): a team's batches run in deadline order. While
every team has work waiting, their in-flight counts converge to their shares' proportions, and
so do their completion rates; a team alone gets every slot. A team over its share (it had the
slots to itself a moment ago) gets nothing until it is back under.

With several models on the fleet, each model's instances are a pool of their own: the free slots
go first to the pools (one at a time, to the pool with the least work in flight per unit of its
weight, e.g. its live instances' seats, among pools with lines waiting), then to the teams
within each pool by the rule above. Team fair share holds within each model's pool, and a
model's batches never take slots whose work would run on another model's instances.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Flow", "allocate", "pool_share"]


@dataclass(frozen=True, slots=True)
class Flow:
    """One active batch, as the allocation sees it."""

    batch_id: str
    team_id: str
    share: int  # the team's weight (teams.share)
    num_in_flight: int  # released and not finished
    num_pending: int  # not released yet
    deadline: float = math.inf  # when its completion window ends (epoch s)
    model: str = ""  # the served model its lines run on: its pool


@dataclass(slots=True)
class _Queue:
    """A batch's running tally during one allocation."""

    order: int
    batch_id: str
    num_in_flight: int
    num_pending: int
    deadline: float


def allocate(flows: Sequence[Flow], num_free: int,
             pool_weights: Mapping[str, float] | None = None) -> dict[str, int]:
    """Lines to release now per batch id (batches getting none are absent).

    `flows` in creation order (the oldest first wins ties). Every batch of a team must carry
    the same share. `pool_weights`: model -> its pool's weight (absent: 1).
    """
    pools: dict[str, list[Flow]] = defaultdict(list)
    for flow in flows:
        pools[flow.model].append(flow)
    if len(pools) <= 1:
        return _allocate_teams(flows, num_free)
    in_flight = {model: sum(f.num_in_flight for f in pool) for model, pool in pools.items()}
    pending = {model: sum(f.num_pending for f in pool) for model, pool in pools.items()}
    weight = {model: _weight(pool_weights, model) for model in pools}
    heap = [(in_flight[m] / weight[m], m) for m in pools if pending[m] > 0]
    heapq.heapify(heap)
    slots: dict[str, int] = defaultdict(int)
    for _ in range(max(num_free, 0)):
        if not heap:
            break
        _, model = heapq.heappop(heap)
        slots[model] += 1
        in_flight[model] += 1
        pending[model] -= 1
        if pending[model] > 0:
            heapq.heappush(heap, (in_flight[model] / weight[model], model))
    grants: dict[str, int] = {}
    for model, count in slots.items():
        grants.update(_allocate_teams(pools[model], count))
    return grants


def pool_share(model: str, models: Iterable[str],
               pool_weights: Mapping[str, float] | None = None) -> float:
    """The share of the window `model`'s pool holds while the pools of `models` all have
    lines waiting (`allocate` converges to it): its weight over theirs (`model` counted among
    them); 1 alone."""
    others = set(models) - {model}
    if not others:
        return 1.0
    mine = _weight(pool_weights, model)
    return mine / (mine + sum(_weight(pool_weights, m) for m in others))


def _weight(pool_weights: Mapping[str, float] | None, model: str) -> float:
    """A pool's weight (absent: 1)."""
    return max((pool_weights or {}).get(model, 1.0), 1e-9)


def _allocate_teams(flows: Sequence[Flow], num_free: int) -> dict[str, int]:
    """`allocate` within one pool: slots to teams by share, then to each team's batches by
    deadline."""
    team_in_flight: dict[str, int] = defaultdict(int)
    team_share: dict[str, int] = {}
    queues: dict[str, list[_Queue]] = defaultdict(list)
    for order, flow in enumerate(flows):
        team_in_flight[flow.team_id] += flow.num_in_flight
        team_share[flow.team_id] = max(flow.share, 1)
        if flow.num_pending > 0:
            queues[flow.team_id].append(
                _Queue(order, flow.batch_id, flow.num_in_flight, flow.num_pending, flow.deadline))
    heap = [(team_in_flight[team] / team_share[team], team) for team in queues]
    heapq.heapify(heap)
    grants: dict[str, int] = defaultdict(int)
    for _ in range(max(num_free, 0)):
        if not heap:
            break
        _, team = heapq.heappop(heap)
        queue = min((q for q in queues[team] if q.num_pending > 0),
                    key=lambda q: (q.deadline, q.order))
        grants[queue.batch_id] += 1
        queue.num_in_flight += 1
        queue.num_pending -= 1
        team_in_flight[team] += 1
        if any(q.num_pending > 0 for q in queues[team]):
            heapq.heappush(heap, (team_in_flight[team] / team_share[team], team))
    return dict(grants)
