"""The current API app's `Services` (built by `create_app`), for views."""

from __future__ import annotations

from flask import current_app

from domain.services import Services

__all__ = ["services"]


def services() -> Services:
    return current_app.extensions["blockq"]
