"""blockq's HTTP API and command line over the shared domain (`domain/`).

`create_app()` builds the Flask app and is the one place that imports the HTTP layer (`app.api`):
a worker importing the shared domain (`domain.request_store`, `domain.live_fleet`, ...) loads
no Flask.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flask import Flask

    from domain.settings import Settings

__all__ = ["create_app"]


def create_app(settings: Settings | None = None) -> Flask:
    """Build the API app from `settings` (default: Settings.load())."""
    # NOTE: the HTTP layer is imported here, not at module level: see the module docstring.
    from flask import Flask  # noqa: PLC0415

    from app.api import (  # noqa: PLC0415
        access_log,
        admin,
        auth,
        batches,
        errors,
        files,
        health,
        held_connections,
        instances,
        metrics,
        openai,
        openapi,
        request_text,
        requests,
        routing,
    )
    from domain.services import Services  # noqa: PLC0415
    from domain.settings import Settings  # noqa: PLC0415

    settings = settings or Settings.load()
    app = Flask(__name__)
    access_log.init_app(app, settings)
    app.config.update(MAX_CONTENT_LENGTH=settings.max_request_bytes, JSON_SORT_KEYS=False)
    app.extensions["blockq"] = services = Services.build(settings)
    services.prompts.warm_up()
    errors.init_app(app)
    held_connections.init_app(app, settings, services.fleet.redis)
    auth.init_app(app, settings, services.fleet.redis.connection_pool)
    request_text.init_app(app)  # after auth: a caller without a key learns nothing more
    routing.init_app(app, services)
    for blueprint in (requests.bp, instances.bp, health.bp, openai.bp, files.bp, batches.bp,
                      admin.bp, metrics.bp, openapi.bp):
        app.register_blueprint(blueprint)
    return app
