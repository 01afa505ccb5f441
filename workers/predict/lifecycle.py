"""Predictor-worker start-up: load the learned length heads of the queues it consumes before
consuming, not on the first request (loading an encoder takes seconds): the fast head for
`predict` (interactive requests), the accurate one for `predict_bulk` (batch lines)."""

from __future__ import annotations

from typing import Any

from celery.signals import celeryd_after_setup

from domain.dispatch import QUEUE_PREDICT, QUEUE_PREDICT_BULK


@celeryd_after_setup.connect
def _warm_up_length_model(sender: Any = None, instance: Any = None, **_: Any) -> None:
    queues = getattr(getattr(instance, "app", None), "amqp", None)
    names = set(queues.queues) if queues is not None else set()
    if not names & {QUEUE_PREDICT, QUEUE_PREDICT_BULK}:
        return
    from workers import runtime  # noqa: PLC0415 - the lifecycle module must stay light
    from workers.predict import stage  # noqa: PLC0415

    rt = runtime.get()
    if rt.settings.length_predictor != "learned":
        return
    heads = {QUEUE_PREDICT: stage.HEAD_FAST, QUEUE_PREDICT_BULK: stage.HEAD_ACCURATE}
    for queue in sorted(names & heads.keys()):
        _ = stage.learned_lengths(rt, heads[queue]).packaged
