"""Predicting and routing a held completion in the API process that accepted it
(`Settings.route_in_api`).

A held completion's client waits at the socket for its first token, so the hop through the
predict queue (a publish, a predictor worker's consume, its claim of the request in a
transaction of its own) is latency and CPU that buys nothing. Here the API predicts the length
and routes the request itself, with the same stages the predict task runs
(`handoff.route_predicted`), and the transaction recording the decision deletes the request's
predict message, which the API had staged in the outbox, deferred, with the request. Whatever
stops this on the way (no instance up, an error, a crash of the API process) leaves that
message to the predict task: the API sends it at once, or the outbox relay sends it after a
crash. Either way one decision is recorded: each is conditional on the request's status.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from domain.dispatch import Message
from domain.models import InferenceRequest, RequestStatus, utcnow
from domain.settings import Settings
from workers.predict import handoff, stage
from workers.runtime import Runtime

__all__ = ["InlineRouter"]

logger = logging.getLogger(__name__)

#: A request this long after its commit is left to the predict task: its API process is
#: saturated (each of its calls waits its turn on the event loop), and the outbox relay sends a
#: deferred entry `outbox_relay_after_s` (2 s) after its commit, which would then race with the
#: API's own routing (one decision is still recorded, but both predict and route it).
MAX_DELAY_S = 0.5


class InlineRouter:
    """Routes requests the API has just stored, on the API's own connections."""

    def __init__(self, settings: Settings, **connections: Any) -> None:
        """`connections`: the API's (`Runtime.SHAREABLE`)."""
        self.rt = Runtime.sharing(settings, **connections)

    def warm_up(self) -> None:
        """Load the learned length model now, as the API starts (as the tokenizer is), not on
        the first completion each API process serves."""
        predictor = stage.length_predictor(self.rt, stage.HEAD_FAST)
        if isinstance(predictor, stage.LearnedLengths):
            _ = predictor.packaged

    def route(self, request: InferenceRequest, predict_entry: tuple[int, Message]) -> bool:
        """Predict and route `request` (stored queued a moment ago) and retire its deferred
        predict message; whether that happened. When it did not, the message is sent: the
        predict task takes the request over (also when the API reaches it `MAX_DELAY_S` or
        more after its commit)."""
        try:
            routed = (_delay_s(request) < MAX_DELAY_S
                      and self._route(request, predict_entry[0]))
        except Exception:  # noqa: BLE001 - the predict task takes over
            logger.exception("routing in the API failed; the predict task takes it over")
            routed = False
        if not routed:
            self.rt.outbox.send([predict_entry])
        return routed

    def _route(self, request: InferenceRequest, entry_id: int) -> bool:
        started_at = time.time()
        started = stage.started_of(request)
        answer = stage.length_predictor(self.rt, stage.HEAD_FAST).predict(started.query)
        timing = {"predict_started_at": started_at, "predicted_at": time.time(),
                  "in_api": 1.0}
        return bool(handoff.route_predicted(self.rt, request.id, started, answer, timing,
                                          status=RequestStatus.QUEUED,
                                          retire=[entry_id]))


def _delay_s(request: InferenceRequest) -> float:
    """Seconds since the request was stored (its `created_at`, set by the API itself)."""
    return (utcnow() - request.created_at).total_seconds()
