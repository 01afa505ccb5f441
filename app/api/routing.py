"""The API's own routing of the held completions it accepts (`Settings.routes_in_api`): the
stages live in the workers (workers/predict/inline.py); this module only builds them on the
API's connections and hands them each request."""

from __future__ import annotations

from flask import Flask, current_app

from domain.dispatch import Message
from domain.models import InferenceRequest
from domain.services import Services

__all__ = ["init_app", "enabled", "route"]

_EXTENSION = "blockq.inline_router"


def init_app(app: Flask, services: Services) -> None:
    if not services.settings.routes_in_api:
        return
    # NOTE: the one place the HTTP layer imports worker code (pyproject's import contracts):
    # the length model and the router, loaded as the app is made.
    from workers.predict.inline import InlineRouter  # noqa: PLC0415

    router = InlineRouter(
        services.settings, db=services.db, redis=services.fleet.redis, fleet=services.fleet,
        celery=services.celery, outbox=services.outbox, prompts=services.prompts)
    router.warm_up()
    app.extensions[_EXTENSION] = router


def enabled() -> bool:
    return _EXTENSION in current_app.extensions


def route(requests: list[InferenceRequest], deferred: list[tuple[int, Message]]) -> None:
    """Route each request just stored; the predict task takes over any that this does not."""
    router = current_app.extensions[_EXTENSION]
    for request, entry in zip(requests, deferred, strict=True):
        router.route(request, entry)
