"""The Grafana dashboard and the Prometheus example in docker/ use only metrics blockq serves."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from app import create_app
from domain.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "docker" / "grafana" / "blockq-dashboard.json"
PROMETHEUS = ROOT / "docker" / "prometheus.yml"

#: Series names of each metric type, from the family name the exposition's TYPE line gives.
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum",
                                                               "_created"),
             "gauge": ("",), "summary": ("", "_count", "_sum", "_created")}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_SELECTOR_PARTS = re.compile(r"\{[^}]*\}|\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
#: Numbers and durations (0.99, 1e3, 5m, 1h30m).
_NUMBER = re.compile(r"(?<![\w:])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?:(?:ms|[smhdwy])\d*)*")
_IDENTIFIER = re.compile(r"[A-Za-z_:][\w:]*")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
             "unless", "offset", "inf", "nan"}
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.+?)\s*(?:,\s*\w+\s*)?\)\s*$")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, labels and grouping
    clauses aside)."""
    text = _STRING.sub(" ", expr)
    text = _VARIABLE.sub(" ", text)
    text = _SELECTOR_PARTS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        followed_by = text[match.end():].lstrip()
        if match.group() in _KEYWORDS or followed_by.startswith("("):
            continue
        names.add(match.group())
    return names


def test_metric_names_are_parsed_out_of_promql() -> None:
    assert metric_names(
        'histogram_quantile(0.99, sum by (le, instance_id) (rate(a_bucket{x=~"y|z"}[5m])))'
    ) == {"a_bucket"}
    assert metric_names("sum(rate(b_sum[$__rate_interval])) / sum(rate(b_count[1m])) > 1e3") == {
        "b_sum", "b_count"}
    assert metric_names('max by (q) (c) unless on (q) d{q="by (x)"} offset 1h30m') == {"c", "d"}
    assert metric_names("clamp_min(deriv(e[5m]), 0) and bool f") == {"e", "f"}


def expressions(node: Any) -> Iterator[str]:
    """Every PromQL expression of the dashboard: panel targets and template variable queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            elif key in ("query", "definition") and isinstance(value, str):
                match = _LABEL_VALUES.match(value)
                if match:
                    yield match.group(1)
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


@pytest.fixture
def served_names(fresh_services: Settings) -> set[str]:
    """Every series name GET /metrics can show, from the TYPE of each family it serves."""
    client = create_app(fresh_services).test_client()
    response = client.get("/metrics")
    assert response.status_code == 200
    return {family.name + suffix
            for family in text_string_to_metric_families(response.text)
            if family.name.startswith("blockq_")
            for suffix in _SUFFIXES[family.type]}


@pytest.mark.services
def test_the_dashboard_queries_only_metrics_blockq_serves(served_names: set[str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = list(expressions(dashboard))
    assert len(exprs) > 20
    referenced = set().union(*(metric_names(e) for e in exprs))
    assert referenced, "no metric found in the dashboard"
    assert referenced <= served_names, sorted(referenced - served_names)
    # Every panel shows something, with the dashboard's data source.
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert all(p["targets"] and p["datasource"]["uid"] == "${datasource}" for p in panels)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_the_prometheus_example_scrapes_the_apis_metrics() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    api = jobs["blockq-api"]
    assert api["metrics_path"] == "/metrics"
    assert any(target.startswith("api:") for group in api["static_configs"]
               for target in group["targets"])
