"""blockq's Flask application: `create_app()` builds it; nothing happens at import time."""

from __future__ import annotations

from flask import Flask

from app import auth, errors, logs, metrics
from app.api import admin, health, instances, openai, requests
from app.api import batches as batches_api  # app.batches: the domain module
from app.api import files as files_api  # app.files: the domain module
from app.extensions import Services
from app.settings import Settings

__all__ = ["create_app"]


def create_app(settings: Settings | None = None) -> Flask:
    """Build the API app from `settings` (default: Settings.load())."""
    settings = settings or Settings.load()
    app = Flask(__name__)
    logs.init_app(app, settings)
    app.config.update(MAX_CONTENT_LENGTH=settings.max_request_bytes, JSON_SORT_KEYS=False)
    app.extensions["blockq"] = services = Services.build(settings)
    services.prompts.warm_up()
    errors.init_app(app)
    auth.init_app(app, settings)
    for blueprint in (requests.bp, instances.bp, health.bp, openai.bp, files_api.bp,
                      batches_api.bp, admin.bp):
        app.register_blueprint(blueprint)
    app.register_blueprint(metrics.bp)
    return app
