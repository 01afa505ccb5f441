"""Observed output lengths per served model, kept in Redis for the baseline predictor."""

from __future__ import annotations

import redis

from workers.predict.baseline import LengthStats

__all__ = ["LengthHistory"]


class LengthHistory:
    def __init__(self, client: redis.Redis, *, model: str, prefix: str = "blockq") -> None:
        self.redis = client
        self.key = f"{prefix}:lengths:{model}"

    def observe(self, num_output_tokens: int) -> None:
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(self.key, "total_tokens", num_output_tokens)
            pipe.hincrby(self.key, "count", 1)
            pipe.execute()

    def stats(self) -> LengthStats:
        raw = self.redis.hgetall(self.key)
        return LengthStats(
            total_tokens=int(raw.get(b"total_tokens", 0)), count=int(raw.get(b"count", 0))
        )
