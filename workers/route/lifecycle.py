"""Router start-up: the workers whose tasks route (`route`, and `predict`, which routes the
request it has just predicted) load the served model's tokenizer before consuming, not in their
first decision.

Why: with prefix caching on, a decision reads the prompt's token ids (`stage.prompt_token_ids`),
and the first one loaded the tokenizer: 6 to 10 s on a 2-core host. The route worker rarely
routes until an instance dies; its first decisions were the re-routes after a crash, which all
waited those seconds while the returned instance came back to an empty engine.
"""

from __future__ import annotations

from typing import Any

from celery.signals import celeryd_after_setup

from domain.dispatch import QUEUE_PREDICT, QUEUE_ROUTE

#: The queues whose tasks run the routing decision.
ROUTING_QUEUES = frozenset({QUEUE_PREDICT, QUEUE_ROUTE})


@celeryd_after_setup.connect
def _warm_up_tokenizer(sender: Any = None, instance: Any = None, **_: Any) -> None:
    queues = getattr(getattr(instance, "app", None), "amqp", None)
    names = set(queues.queues) if queues is not None else set()
    if not names & ROUTING_QUEUES:
        return
    from workers import runtime  # noqa: PLC0415 - the lifecycle module must stay light

    rt = runtime.get()
    if rt.settings.engine_prefix_caching:
        rt.prompts.warm_up()
