"""The autoscaler's record in Redis: its last decision (desired instances per model and GPU kind,
with the reason) and its decision counts, which GET /metrics shows to Prometheus and KEDA
(`blockq_desired_instances{model,gpu_kind}`, `blockq_autoscale_decisions_total`).

Redis, not the supervisor's memory: every API process answers the scrape, and the record
outlives a restarted supervisor (the next decision replaces it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import redis

__all__ = ["DESIRED_KEY", "DECISIONS_KEY", "DesiredInstances", "decision_counts",
           "desired_instances", "record_decision"]

#: Hash "<model>\x1f<gpu_kind>" -> desired instances, replaced at each decision of the model.
DESIRED_KEY = "blockq:autoscale:desired"
#: Hash "<model>\x1f<action>" -> decisions so far (up, down, hold).
DECISIONS_KEY = "blockq:autoscale:decisions"
#: Hash model -> the last decision as JSON (reason, rates, cost), for operators.
LAST_KEY = "blockq:autoscale:last"
_SEP = "\x1f"


@dataclass(frozen=True, slots=True)
class DesiredInstances:
    model: str
    gpu_kind: str
    count: int


def record_decision(client: redis.Redis, model: str, action: str,
                    desired_by_kind: Mapping[str, int], summary: Mapping[str, object]) -> None:
    """Record one model's decision: its desired instances per GPU kind (every kind of the model,
    0 included), one more decision of `action`, and its summary."""
    pipe = client.pipeline()
    stale = [field for field in client.hkeys(DESIRED_KEY)
             if _text(field).split(_SEP, 1)[0] == model
             and _text(field).split(_SEP, 1)[1] not in desired_by_kind]
    if stale:
        pipe.hdel(DESIRED_KEY, *stale)
    pipe.hset(DESIRED_KEY, mapping={f"{model}{_SEP}{kind}": count
                                    for kind, count in desired_by_kind.items()})
    pipe.hincrby(DECISIONS_KEY, f"{model}{_SEP}{action}", 1)
    pipe.hset(LAST_KEY, model, json.dumps(summary))
    pipe.execute()


def desired_instances(client: redis.Redis) -> list[DesiredInstances]:
    out = []
    for field, value in client.hgetall(DESIRED_KEY).items():
        model, _, kind = _text(field).partition(_SEP)
        out.append(DesiredInstances(model, kind, int(value)))
    return sorted(out, key=lambda d: (d.model, d.gpu_kind))


def decision_counts(client: redis.Redis) -> Iterable[tuple[str, str, int]]:
    """(model, action, count) of every decision recorded."""
    for field, value in sorted(client.hgetall(DECISIONS_KEY).items()):
        model, _, action = _text(field).partition(_SEP)
        yield model, action, int(value)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
