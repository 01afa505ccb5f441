"""Hostile latency targets (the `slo` body field, native and OpenAI, and the x-slo-* headers):
each refused with a 400 naming it, and nothing stored.

The ~170 refusals share one API and one database (module scope): a refusal stores nothing, and
each test checks that it did not, so no test can see another's leftovers unless one fails."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import func, select

from domain.models import InferenceRequest
from domain.settings import Settings
from tests.app.flask_client import api_client, error_body, services_of

pytestmark = pytest.mark.services

CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def refusing(services_factory, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[FlaskClient]:
    """One API on an empty database, for the whole module (block routing, as in
    test_slo_api.py)."""
    settings: Settings = services_factory(tmp_path_factory.mktemp("slo_refusals")).model_copy(
        update={"sync_timeout_s": 1.0, "routing_policy": "block",
                "length_predictor": "baseline"})
    client = api_client(settings)
    yield client
    services_of(client).db.engine.dispose()


def _stored(client: FlaskClient) -> int:
    with services_of(client).db.session() as session:
        return session.scalar(select(func.count()).select_from(InferenceRequest)) or 0


HOSTILE_SLO: list[Any] = [
    {"ttft_ms": 0}, {"ttft_ms": -5}, {"ttft_ms": 0.5}, {"e2e_ms": 3_600_001},
    {"ttft_ms": 10**30}, {"ttft_ms": "100"}, {"ttft_ms": True}, {"ttft_ms": None},
    {"ttft_ms": [100]}, {"ttft_ms": {"ms": 1}}, {}, {"ttft_ms": 100, "bogus": 1},
    {"ttft_ms": 500, "e2e_ms": 100}, "fast", 100, [100], True,
]


#: A body of each endpoint taking targets; the OpenAI ones also take the headers.
BODIES: dict[str, dict[str, Any]] = {
    "/v1/requests": {"prompt": "Hi", "max_tokens": 4},
    "/v1/completions": {"model": "tiny-llama", "prompt": "Hi", "max_tokens": 4},
    "/v1/chat/completions": CHAT,
}
OPENAI_PATHS = ["/v1/completions", "/v1/chat/completions"]


@pytest.mark.parametrize("slo", HOSTILE_SLO, ids=repr)
@pytest.mark.parametrize("path", list(BODIES))
def test_hostile_slo_bodies_are_refused_naming_the_field(refusing: FlaskClient, path: str,
                                                         slo: Any) -> None:
    error = error_body(refusing.post(path, json=BODIES[path] | {"slo": slo}), 400)
    assert (error["param"] or "").startswith("slo"), error
    assert _stored(refusing) == 0


@pytest.mark.parametrize("slo", [{"ttft_ms": -1}, {"e2e_ms": 0}, "fast"], ids=repr)
@pytest.mark.parametrize("path", OPENAI_PATHS)
def test_hostile_slo_bodies_of_streams_are_refused_before_the_stream(
        refusing: FlaskClient, path: str, slo: Any) -> None:
    error = error_body(refusing.post(path, json=BODIES[path] | {"stream": True, "slo": slo}),
                       400)
    assert (error["param"] or "").startswith("slo"), error
    assert _stored(refusing) == 0


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e999", "-0", "1e-999",
                                 '"NaN"', "null", "18446744073709551617"])
@pytest.mark.parametrize("path", list(BODIES))
def test_non_finite_numbers_are_refused(refusing: FlaskClient, path: str, raw: str) -> None:
    body = json.dumps(BODIES[path] | {"slo": {"ttft_ms": "RAW"}}).replace('"RAW"', raw)
    response = refusing.post(path, content_type="application/json", data=body)
    error = error_body(response, 400)
    assert (error["param"] or "slo").startswith("slo"), error
    assert _stored(refusing) == 0


HOSTILE_HEADERS = ["abc", "-1", "0", "0.5", "1e3", "nan", "inf", "", " ", "1,2", "100 ms",
                   "9" * 50, "3600001", "0x10", "+100", "1_000", "100.", ".5"]


@pytest.mark.parametrize("value", HOSTILE_HEADERS, ids=repr)
@pytest.mark.parametrize("header", ["x-slo-ttft-ms", "x-slo-e2e-ms"])
@pytest.mark.parametrize("path", OPENAI_PATHS)
def test_hostile_target_headers_are_refused_naming_the_header(
        refusing: FlaskClient, path: str, header: str, value: str) -> None:
    error = error_body(refusing.post(path, headers={header: value}, json=BODIES[path]), 400)
    assert error["param"] == header and error["code"] == "invalid_value"
    assert _stored(refusing) == 0


@pytest.mark.parametrize("value", ["\u0661\u0660\u0660", "100\u2009ms", "1" * 10_000,
                                   "100\x00", "NaN", "-0.0"], ids=repr)
@pytest.mark.parametrize("path", OPENAI_PATHS)
def test_odd_header_bytes_are_refused_not_crashed_on(refusing: FlaskClient, path: str,
                                                     value: str) -> None:
    """Arabic-Indic digits, a thin space and a unit, a 10 kB value, a NUL: 400, never 500."""
    response = refusing.post(path, headers=[("x-slo-ttft-ms", value)], json=BODIES[path])
    error = error_body(response, 400)
    assert error["param"] == "x-slo-ttft-ms"
    assert _stored(refusing) == 0
