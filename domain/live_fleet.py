"""The fleet's live state in Redis: what engine workers publish and routers and the API read.

Key layout (all under one prefix):
  <p>:instances                  set of instance ids that ever registered
  <p>:instance_models            hash instance id -> the model it last declared it serves
  <p>:instance:<id>:state        latest published state, JSON (kept after death, for the API)
  <p>:instance:<id>:alive        heartbeat, expires after heartbeat_ttl_s
  <p>:instance:<id>:assigned     hash request_id -> routed time: routed, not yet in the engine
  <p>:instance:<id>:recent       sorted set of assignments by routed time, the last
                                 recent_window_s (admitted or not): the expected future load
  <p>:cancel:<request_id>        set when a request is cancelled, read by engine workers
  <p>:instance:<id>:control      operator's hold on an instance: "drained", "paused" or the
                                 autoscaler's "scaling_down"
  <p>:routing:policy             operator's routing policy override (else the configured one)
  <p>:round_robin:<model>        round robin's counter of the model's pool (every router's)
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Iterable

import redis

from workers.sim.engine_state import EngineState
from workers.sim.instance_status import Assignment, InstanceStatus, future_load_of, routable

__all__ = ["Fleet", "InstanceStatus"]

_CANCEL_TTL_S = 24 * 3600

# NOTE: the reads of every instance in one script: one round trip where a pipeline needs the
# instance ids first (two). The scripts build the instances' keys from their ids (ARGV[1]: the
# prefix), which a single Redis allows.
#: KEYS: the instances set, the routing policy override; ARGV: prefix, and the start of the
#: recent window ("": none). The override first, then per instance: id, state, alive, assigned
#: (values), control[, recent assignments].
_STATUSES = """
local out = {redis.call('GET', KEYS[2])}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
    local key = ARGV[1] .. ':instance:' .. id .. ':'
    out[#out + 1] = id
    out[#out + 1] = redis.call('GET', key .. 'state')
    out[#out + 1] = redis.call('EXISTS', key .. 'alive')
    out[#out + 1] = redis.call('HVALS', key .. 'assigned')
    out[#out + 1] = redis.call('GET', key .. 'control')
    if ARGV[2] ~= '' then
        out[#out + 1] = redis.call('ZRANGEBYSCORE', key .. 'recent', ARGV[2], '+inf')
    end
end
return out
"""
#: KEYS[1]: the instance_models hash; ARGV[1]: the prefix. Per instance: id, model, alive.
_MODEL_INSTANCES = """
local out = {}
local declared = redis.call('HGETALL', KEYS[1])
for i = 1, #declared, 2 do
    out[#out + 1] = declared[i]
    out[#out + 1] = declared[i + 1]
    out[#out + 1] = redis.call('EXISTS', ARGV[1] .. ':instance:' .. declared[i] .. ':alive')
end
return out
"""

#: KEYS: the instances set, the instance_models hash; ARGV: prefix, instance ids. Drops each
#: instance without a heartbeat; returns the ids dropped.
_FORGET = """
local out = {}
for i = 2, #ARGV do
    local key = ARGV[1] .. ':instance:' .. ARGV[i] .. ':'
    if redis.call('EXISTS', key .. 'alive') == 0 then
        redis.call('SREM', KEYS[1], ARGV[i])
        redis.call('HDEL', KEYS[2], ARGV[i])
        redis.call('DEL', key .. 'state', key .. 'assigned', key .. 'recent')
        out[#out + 1] = ARGV[i]
    end
end
return out
"""


class Fleet:
    """Reads and writes instance states, heartbeats, assignments and cancellations."""

    def __init__(self, client: redis.Redis, *, heartbeat_ttl_s: float, prefix: str = "blockq",
                 recent_window_s: float = 0.0):
        self.redis = client
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self.prefix = prefix
        # Routing history kept per instance for its expected future load (0: none kept).
        self.recent_window_s = recent_window_s
        self._statuses = client.register_script(_STATUSES)
        self._model_instances = client.register_script(_MODEL_INSTANCES)

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    # --- engine workers ------------------------------------------------------------------------
    def publish(self, instance_id: str, state: EngineState) -> int:
        """Store the state and renew the heartbeat in one round trip; the requests the state
        shows are no longer counted as assigned. Returns how many requests the router holds
        (late binding: `hold_request`)."""
        payload = json.dumps(dataclasses.replace(state, published_at=time.time()).to_json())
        shown = [r.request_id for r in state.requests]
        with self.redis.pipeline(transaction=True) as pipe:
            if shown:
                pipe.hdel(self._key("instance", instance_id, "assigned"), *shown)
            pipe.sadd(self._key("instances"), instance_id)
            pipe.hset(self._key("instance_models"), instance_id, state.model)
            pipe.set(self._key("instance", instance_id, "state"), payload)
            pipe.set(
                self._key("instance", instance_id, "alive"),
                "1",
                px=int(self.heartbeat_ttl_s * 1000),
            )
            pipe.zcard(self._key("routing", "held"))
            return int(pipe.execute()[-1])

    def mark_stopped(self, instance_id: str) -> None:
        self.redis.delete(self._key("instance", instance_id, "alive"))

    def unassign(self, instance_id: str, request_id: str) -> None:
        """The engine will not run this request (it was re-routed, finished or cancelled)."""
        self.redis.hdel(self._key("instance", instance_id, "assigned"), request_id)

    def cancelled(self, request_ids: Iterable[str]) -> set[str]:
        ids = list(request_ids)
        if not ids:
            return set()
        flags = self.redis.mget([self._key("cancel", rid) for rid in ids])
        return {rid for rid, flag in zip(ids, flags, strict=True) if flag}

    # --- routers -------------------------------------------------------------------------------
    def assign(
        self,
        instance_id: str,
        request_id: str,
        *,
        num_prompt_tokens: int,
        predicted_output_tokens: int | None,
        priority_class: int = 0,
    ) -> None:
        """Record a routing decision so the next decision sees it before the engine shows it."""
        entry = Assignment(request_id, num_prompt_tokens, predicted_output_tokens, time.time(),
                           priority_class)
        payload = json.dumps(entry.to_json())
        if self.recent_window_s <= 0:
            self.redis.hset(self._key("instance", instance_id, "assigned"), request_id, payload)
            return
        recent = self._key("instance", instance_id, "recent")
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(self._key("instance", instance_id, "assigned"), request_id, payload)
            pipe.zadd(recent, {payload: entry.at})
            pipe.zremrangebyscore(recent, "-inf", entry.at - self.recent_window_s)
            pipe.expire(recent, math.ceil(self.recent_window_s))
            pipe.execute()

    # --- late binding: requests the router holds until an instance would start them ---------
    def hold_request(self, request_id: str, since: float) -> None:
        """Hold `request_id` at the router, held since `since` (Unix time; kept if already
        held: its place in line does not move)."""
        self.redis.zadd(self._key("routing", "held"), {request_id: since}, nx=True)

    def unhold(self, request_id: str) -> None:
        self.redis.zrem(self._key("routing", "held"), request_id)

    def held(self, limit: int) -> list[tuple[str, float]]:
        """The `limit` requests held longest, oldest first, with the time each was held."""
        rows = self.redis.zrange(self._key("routing", "held"), 0, limit - 1, withscores=True)
        return [(_text(member), float(since)) for member, since in rows]

    def held_request_ids(self, since: float) -> set[str]:
        """The requests held since `since` (Unix time) or later."""
        members = self.redis.zrangebyscore(self._key("routing", "held"), since, "+inf")
        return {_text(m) for m in members}

    def next_round_robin(self, model: str) -> int:
        """The next ticket of `model`'s pool: every router takes turns from one counter."""
        return int(self.redis.incr(self._key("round_robin", model)))

    # --- API and health ------------------------------------------------------------------------
    def request_cancel(self, request_id: str) -> None:
        self.redis.set(self._key("cancel", request_id), "1", ex=_CANCEL_TTL_S)

    def statuses(self) -> list[InstanceStatus]:
        """Every registered instance, alive or not, sorted by id (one round trip)."""
        return self._read()[0]

    def routing_view(self) -> tuple[list[InstanceStatus], str | None]:
        """What a routing decision reads, in one round trip: every instance's status (the
        decision pipeline filters the candidates) and the operator's policy override
        (`policy_override`)."""
        return self._read()

    def _read(self) -> tuple[list[InstanceStatus], str | None]:
        """Every registered instance's status, sorted by id, and the policy override."""
        window_s = self.recent_window_s
        since = time.time() - window_s
        override, *replies = self._statuses(
            keys=[self._key("instances"), self._key("routing", "policy")],
            args=[self.prefix, repr(since) if window_s > 0 else ""])
        now = time.time()
        width = 6 if window_s > 0 else 5
        groups = sorted((replies[i : i + width] for i in range(0, len(replies), width)),
                        key=lambda group: _text(group[0]))
        statuses = []
        for raw_id, *reads in groups:
            status = _status(_text(raw_id), *reads[:4], now=now)
            if window_s > 0:
                recent = (Assignment.from_json(json.loads(raw)) for raw in reads[4])
                status = dataclasses.replace(
                    status, future_load=future_load_of(recent, now, window_s))
            statuses.append(status)
        return statuses, None if override is None else _text(override)

    def model_instances(self) -> dict[str, dict[str, bool]]:
        """Model -> {instance id: whether its heartbeat is fresh} over every instance that has
        declared a model (one round trip, no state read: what the API checks a request's
        model against)."""
        replies = self._model_instances(keys=[self._key("instance_models")], args=[self.prefix])
        models: dict[str, dict[str, bool]] = {}
        for i in range(0, len(replies), 3):
            instance_id, model, alive = replies[i : i + 3]
            models.setdefault(_text(model), {})[_text(instance_id)] = bool(alive)
        return {model: dict(sorted(ids.items())) for model, ids in models.items()}

    def live_models(self) -> list[str]:
        """The models an instance with a fresh heartbeat serves, sorted."""
        return sorted(m for m, ids in self.model_instances().items() if any(ids.values()))

    def routable(self, model: str | None = None) -> list[InstanceStatus]:
        """Instances with a fresh heartbeat that accept new requests: routing candidates (of
        `model` only, when given)."""
        return routable(self.statuses(), model)

    def ping(self) -> bool:
        return bool(self.redis.ping())

    def forget(self, instance_ids: Iterable[str]) -> list[str]:
        """Drop dead instances from the registry (listing, model check, routing): their state,
        assignments and model. One that published again meanwhile is kept. Returns those
        dropped; one that comes back later registers again with its next publication."""
        ids = list(instance_ids)
        if not ids:
            return []
        forgotten = self.redis.eval(_FORGET, 2, self._key("instances"),
                                    self._key("instance_models"), self.prefix, *ids)
        return [_text(member) for member in forgotten]

    # --- operators -----------------------------------------------------------------------------
    def hold(self, instance_id: str, control: str | None) -> None:
        """Drain or pause an instance (`control`), or release it (None)."""
        key = self._key("instance", instance_id, "control")
        if control is None:
            self.redis.delete(key)
        else:
            self.redis.set(key, control)

    def policy_override(self) -> str | None:
        raw = self.redis.get(self._key("routing", "policy"))
        return raw.decode() if raw is not None else None

    def set_policy_override(self, policy: str | None) -> None:
        key = self._key("routing", "policy")
        if policy is None:
            self.redis.delete(key)
        else:
            self.redis.set(key, policy)


def _status(
    instance_id: str, raw_state: bytes | None, alive: int, raw_assigned: list[bytes],
    raw_control: bytes | None, *, now: float,
) -> InstanceStatus:
    state = EngineState.from_json(json.loads(raw_state)) if raw_state else None
    published_at = state.published_at if state is not None else None
    assigned = sorted((Assignment.from_json(json.loads(raw)) for raw in raw_assigned),
                      key=lambda entry: entry.at)
    return InstanceStatus(
        instance_id=instance_id,
        alive=bool(alive),
        heartbeat_age_s=None if published_at is None else max(0.0, now - published_at),
        state=state,
        assigned=tuple(assigned),
        control=raw_control.decode() if raw_control is not None else None,
    )


def _text(member: bytes | str) -> str:
    return member.decode() if isinstance(member, bytes) else member
