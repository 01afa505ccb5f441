"""The workers whose tasks route load the tokenizer before consuming (workers/route/lifecycle.py):
with prefix caching on, a decision reads the prompt's token ids, and the first one otherwise
waited seconds for the tokenizer to load."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from domain.prompts import PromptCodec
from domain.settings import Settings
from workers import runtime
from workers.route import lifecycle


def _worker(*queues: str) -> SimpleNamespace:
    """What the signal reads of a Celery worker: the queues it consumes."""
    return SimpleNamespace(app=SimpleNamespace(amqp=SimpleNamespace(
        queues=dict.fromkeys(queues))))


@pytest.mark.parametrize(("queues", "prefix_caching", "warmed"), [
    (("route",), True, True),
    (("predict",), True, True),
    (("route",), False, False),  # decisions read no token ids
    (("predict_bulk",), True, False),
    (("webhooks",), True, False),
    (("gpu.0",), True, False),  # an engine worker loads its own, as it starts its engine
])
def test_a_routing_worker_loads_the_tokenizer_before_consuming(
        monkeypatch: pytest.MonkeyPatch, queues: tuple[str, ...], prefix_caching: bool,
        warmed: bool) -> None:
    loaded: list[str] = []
    monkeypatch.setattr(PromptCodec, "warm_up", lambda self: loaded.append(str(self.model_path)))
    monkeypatch.setattr(runtime, "_runtime", None)
    rt = runtime.configure(Settings(engine_prefix_caching=prefix_caching))

    lifecycle._warm_up_tokenizer(sender="worker@host", instance=_worker(*queues))

    assert loaded == ([str(rt.settings.resolved_model_path)] if warmed else [])
