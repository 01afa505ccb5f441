"""GET /metrics: Prometheus text format for the scraper (no API key; see `app/metrics.py`)."""

from __future__ import annotations

from flask import Blueprint, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.api.services import services
from app.metrics import scrape_registry

__all__ = ["bp"]

bp = Blueprint("metrics", __name__)


@bp.get("/metrics")
def scrape() -> Response:
    return Response(generate_latest(scrape_registry(services())), content_type=CONTENT_TYPE_LATEST)
