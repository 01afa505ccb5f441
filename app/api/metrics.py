"""GET /metrics: Prometheus text format for the scraper (no API key; the metrics token when
`metrics_token` is set; see `domain/metrics.py`)."""

from __future__ import annotations

import hmac

from flask import Blueprint, Response, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.api.services import services
from domain.errors import Unauthorized
from domain.metrics import scrape_registry
from domain.settings import Settings

__all__ = ["bp"]

bp = Blueprint("metrics", __name__)


@bp.get("/metrics")
def scrape() -> Response:
    _check_token(services().settings)
    return Response(generate_latest(scrape_registry(services())), content_type=CONTENT_TYPE_LATEST)


def _check_token(settings: Settings) -> None:
    """With `metrics_token` set, only `Authorization: Bearer <that token>` may scrape."""
    if settings.metrics_token is None:
        return
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    expected = settings.metrics_token.get_secret_value().encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
        raise Unauthorized("GET /metrics needs the metrics token: 'Authorization: Bearer "
                           "<BLOCKQ_METRICS_TOKEN>'.", code="invalid_metrics_token")
