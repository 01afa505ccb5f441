"""The bias watch: a correction factor learned from recent length errors, and the routing
fallback (a policy that reads no predicted length) when predictions keep missing.

State lives in Redis so that every predictor, router and engine worker shares it: the engine
workers observe finished requests, the predictor workers apply the correction, the routers and
the API read the fallback.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

import redis

from workers.route.pipeline import FALLBACK_POLICY  # the rule lives with the decision

__all__ = ["BiasRule", "BiasWatch", "FALLBACK_POLICY", "fallback_state", "relative_error"]

_FALLBACK_KEY = "routing:fallback"


@dataclass(frozen=True, slots=True)
class BiasRule:
    #: Fallback when this many consecutive finished requests ...
    window: int = 10
    #: ... were each predicted more than this far off (relative to the actual length).
    threshold: float = 0.5
    #: How long routing falls back to FALLBACK_POLICY.
    fallback_s: float = 60.0
    #: Step of the multiplicative correction towards actual/predicted, per observation.
    #: NOTE: an error is observed as many requests after its prediction as are in flight (often
    #: a hundred); step x delay must stay well below 1 or the correction overshoots.
    correction_rate: float = 0.005
    #: The correction stays within [1 / max_correction, max_correction].
    max_correction: float = 4.0


def relative_error(predicted: int, actual: int) -> float:
    return abs(predicted - actual) / max(actual, 1)


class BiasWatch:
    def __init__(self, client: redis.Redis, rule: BiasRule, *, prefix: str = "blockq") -> None:
        self.redis = client
        self.rule = rule
        self.prefix = prefix
        self.fallback_key = f"{prefix}:{_FALLBACK_KEY}"

    def _key(self, model: str, what: str) -> str:
        return f"{self.prefix}:bias:{model}:{what}"

    def observe(self, model: str, predicted: int, actual: int) -> bool:
        """Record one finished request; True when this observation started a fallback."""
        error = relative_error(predicted, actual)
        step = self.rule.correction_rate * math.log(max(actual, 1) / max(predicted, 1))
        errors_key = self._key(model, "errors")
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.lpush(errors_key, error)
            pipe.ltrim(errors_key, 0, self.rule.window - 1)
            pipe.lrange(errors_key, 0, -1)
            pipe.incrbyfloat(self._key(model, "log_correction"), step)
            recent, log_correction = pipe.execute()[2:]
        bound = math.log(self.rule.max_correction)
        if abs(float(log_correction)) > bound:  # NOTE: clamp; a race here only re-clamps
            self.redis.set(self._key(model, "log_correction"), math.copysign(bound,
                                                                             float(log_correction)))
        missed = len(recent) == self.rule.window and all(
            float(e) > self.rule.threshold for e in recent)
        return missed and self._enter_fallback(model, recent)

    def _enter_fallback(self, model: str, recent: list[bytes]) -> bool:
        now = time.time()
        state = {"reason": f"{self.rule.window} consecutive length predictions of {model} more "
                           f"than {self.rule.threshold:.0%} off",
                 "model": model, "errors": [round(float(e), 3) for e in recent],
                 "since": now, "until": now + self.rule.fallback_s}
        entered = self.redis.set(self.fallback_key, json.dumps(state), nx=True,
                                 px=int(self.rule.fallback_s * 1000))
        if entered:
            self.redis.delete(self._key(model, "errors"))  # the next fallback needs new misses
        return bool(entered)

    def correction(self, model: str) -> float:
        raw = self.redis.get(self._key(model, "log_correction"))
        return math.exp(float(raw)) if raw is not None else 1.0

    def fallback(self) -> dict[str, Any] | None:
        return fallback_state(self.redis, prefix=self.prefix)

    def reset(self, model: str) -> None:
        """Forget the errors and the correction (a new model version was promoted)."""
        self.redis.delete(self._key(model, "errors"), self._key(model, "log_correction"))


def fallback_state(client: redis.Redis, *, prefix: str = "blockq") -> dict[str, Any] | None:
    """The fallback in force ({reason, model, errors, since, until}), or None."""
    raw = client.get(f"{prefix}:{_FALLBACK_KEY}")
    return json.loads(raw) if raw is not None else None
