"""Learning feedback from finished requests: the baseline's running mean of output lengths and
the bias watch over the length predictor, which falls back and asks for a retrain."""

from __future__ import annotations

import logging

import redis

from domain import dispatch
from domain.length_bias import BiasWatch
from workers.predict.history import LengthHistory
from workers.runtime import current_celery

__all__ = ["LengthFeedback"]

logger = logging.getLogger(__name__)


class LengthFeedback:
    """What each finished request teaches the length predictors of one served model."""

    def __init__(self, client: redis.Redis, bias_watch: BiasWatch, model_name: str) -> None:
        self.redis = client
        self.bias_watch = bias_watch
        self.model_name = model_name

    def observe(self, predicted: int | None, actual: int) -> None:
        """Feed the baseline's running mean and the bias watch; a new fallback asks for a
        retrain of the length model."""
        LengthHistory(self.redis, model=self.model_name).observe(actual)
        if predicted is None or not self.bias_watch.observe(self.model_name, predicted, actual):
            return
        logger.warning("length predictions keep missing: routing falls back to round_robin")
        dispatch.retrain(reason="bias watch").send(current_celery())
