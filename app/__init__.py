"""blockq's Flask application: `create_app()` builds it; nothing happens at import time."""

from __future__ import annotations

import logging

from flask import Flask

from app import auth, errors
from app.api import health, instances, openai, requests
from app.extensions import Services
from app.settings import Settings

__all__ = ["create_app"]


def create_app(settings: Settings | None = None) -> Flask:
    """Build the API app from `settings` (default: Settings.load())."""
    settings = settings or Settings.load()
    logging.basicConfig(level=settings.log_level)
    app = Flask(__name__)
    app.config.update(MAX_CONTENT_LENGTH=settings.max_request_bytes, JSON_SORT_KEYS=False)
    app.extensions["blockq"] = services = Services.build(settings)
    services.prompts.warm_up()
    errors.init_app(app)
    auth.init_app(app, settings)
    for blueprint in (requests.bp, instances.bp, health.bp, openai.bp):
        app.register_blueprint(blueprint)
    return app
