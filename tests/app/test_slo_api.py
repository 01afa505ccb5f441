"""Latency targets through the API, on PostgreSQL: the `slo` body field (native and OpenAI)
and the x-slo-* headers (OpenAI) (hostile values: test_slo_refusals.py); the targets and the
team's action kept on the request; the team's action set by an admin; and a refusal at routing
(the real predict task, block policy) answered to a held OpenAI call, sync or streamed, as 429
with Retry-After before any byte of an answer."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from flask.testing import FlaskClient
from sqlalchemy import func, select

from app.api import openai as openai_api
from app.cli import main as cli
from domain.errors import InvalidRequest
from domain.models import InferenceRequest, Team
from domain.openai_schemas import CompletionBody, native_body
from domain.settings import Settings
from domain.teams import ensure_team_key, team_by_name
from tests.app.flask_client import api_client, error_body, services_of
from tests.engine_states import engine_state
from workers import runtime
from workers.predict import tasks as predict_tasks
from workers.runtime import Runtime

pytestmark = pytest.mark.services

CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


@pytest.fixture
def settings(fresh_services: Settings) -> Settings:
    """A short sync timeout (nothing consumes unless a test runs the predict task), block."""
    return fresh_services.model_copy(update={
        "sync_timeout_s": 1.0, "routing_policy": "block", "length_predictor": "baseline"})


@pytest.fixture
def client(settings: Settings) -> FlaskClient:
    return api_client(settings)


@pytest.fixture
def worker(settings: Settings, fresh_services: Settings) -> Iterator[Runtime]:
    """The predict worker's runtime, with one idle instance published."""
    rt = runtime.configure(settings)
    rt.fleet.publish("gpu.0", engine_state(model=settings.default_model))  # serves its model
    yield rt
    rt.db.engine.dispose()
    runtime.configure(fresh_services)


def _stored(client: FlaskClient) -> int:
    with services_of(client).db.session() as session:
        return session.scalar(select(func.count()).select_from(InferenceRequest)) or 0


def _set_action(client: FlaskClient, action: str, team: str = "tests") -> None:
    with services_of(client).db.session() as session:
        team_by_name(session, team).slo_miss_action = action


def test_a_header_and_a_body_target_must_agree(client: FlaskClient) -> None:
    error = error_body(client.post("/v1/chat/completions", headers={"x-slo-ttft-ms": "300"},
                                   json=CHAT | {"slo": {"ttft_ms": 200}}), 400)
    assert error["param"] == "slo.ttft_ms"
    error = error_body(client.post("/v1/chat/completions", headers={"x-slo-ttft-ms": "900"},
                                   json=CHAT | {"slo": {"e2e_ms": 500}}), 400)
    assert error["param"] == "slo"  # together: an e2e target below the TTFT one
    assert _stored(client) == 0


def test_targets_are_for_interactive_requests_not_batch_work(client: FlaskClient) -> None:
    error = error_body(client.post("/v1/requests", json={
        "prompt": "Hi", "priority": "batch", "slo": {"ttft_ms": 500}}), 400)
    assert error["param"] == "slo"
    line = CompletionBody.model_validate({"model": "tiny-llama", "prompt": "Hi",
                                          "slo": {"e2e_ms": 900}})
    with pytest.raises(InvalidRequest) as refused:
        native_body(line, priority="batch")
    assert refused.value.param == "slo"


def test_targets_and_the_teams_action_are_kept_with_the_request(client: FlaskClient) -> None:
    _set_action(client, "queue")
    created = client.post("/v1/requests", json={"prompt": "Hi", "max_tokens": 4,
                                                "slo": {"ttft_ms": 250, "e2e_ms": 4000.5}})
    assert created.status_code == 202
    shown = client.get(f"/v1/requests/{created.get_json()['id']}").get_json()
    assert shown["slo"] == {"ttft_ms": 250.0, "e2e_ms": 4000.5, "miss_action": "queue",
                            "ttft_met": None, "e2e_met": None, "met": None}
    plain = client.post("/v1/requests", json={"prompt": "Hi", "max_tokens": 4})
    assert client.get(f"/v1/requests/{plain.get_json()['id']}").get_json()["slo"] is None


def test_openai_headers_set_the_targets_of_every_choice(client: FlaskClient) -> None:
    """No worker runs: the call times out (504), its requests stay, with their targets."""
    response = client.post("/v1/completions", headers={"X-SLO-TTFT-MS": "750",
                                                       "x-slo-e2e-ms": "5000"},
                           json={"model": "tiny-llama", "prompt": ["a", "b"], "max_tokens": 2})
    assert response.status_code == 504
    with services_of(client).db.session() as session:
        rows = session.execute(select(InferenceRequest.slo_ttft_ms, InferenceRequest.slo_e2e_ms,
                                      InferenceRequest.slo_miss_action)).all()
    assert sorted(rows) == [(750.0, 5000.0, "route")] * 2


def test_admins_set_a_teams_action_on_unmeetable_targets(settings: Settings,
                                                         client: FlaskClient) -> None:
    with services_of(client).db.session() as session:
        admin_key = ensure_team_key(session, "ops", is_admin=True).key
        team_id = team_by_name(session, "tests").id
    admin = api_client(settings, key=admin_key)
    path = f"/v1/admin/teams/{team_id}"
    assert admin.get(path).get_json()["slo_miss_action"] == "route"

    changed = admin.patch(path, json={"slo_miss_action": "refuse"})
    assert changed.status_code == 200 and changed.get_json()["slo_miss_action"] == "refuse"
    with services_of(client).db.session() as session:
        assert session.get(Team, team_id).slo_miss_action == "refuse"  # type: ignore[union-attr]

    for bad in ({"slo_miss_action": "drop"}, {"slo_miss_action": None}, {"share": 3}, {}, []):
        assert error_body(admin.patch(path, json=bad), 400)
    assert error_body(admin.patch("/v1/admin/teams/team_nope",
                                  json={"slo_miss_action": "queue"}), 404)
    assert error_body(client.patch(path, json={"slo_miss_action": "route"}), 403)
    assert error_body(client.get(path), 403)


def test_the_cli_creates_and_changes_a_teams_action(
        settings: Settings, client: FlaskClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", settings.resolved_database_url)
    runner = CliRunner()
    created = runner.invoke(cli, ["teams", "create", "search", "--slo-miss-action", "queue"])
    assert created.exit_code == 0, created.output
    changed = runner.invoke(cli, ["teams", "set", "search", "--slo-miss-action", "refuse"])
    assert changed.exit_code == 0, changed.output
    assert runner.invoke(cli, ["teams", "set", "search", "--slo-miss-action", "drop"]
                         ).exit_code != 0
    assert runner.invoke(cli, ["teams", "set", "nobody", "--slo-miss-action", "route"]
                         ).exit_code != 0
    with services_of(client).db.session() as session:
        assert team_by_name(session, "search").slo_miss_action == "refuse"


def _submitted(client: FlaskClient, count: int = 1, timeout_s: float = 10.0) -> list[str]:
    """Ids of the requests stored so far, once there are `count`."""
    deadline = time.monotonic() + timeout_s
    while True:
        with services_of(client).db.session() as session:
            ids = list(session.scalars(select(InferenceRequest.id)))
        if len(ids) >= count:
            return ids
        assert time.monotonic() < deadline, "the call stored nothing"
        time.sleep(0.02)


def _call_in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    answer: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: answer.update(response=call()), daemon=True)
    thread.start()
    return thread, answer


@pytest.mark.parametrize("stream", [False, True])
def test_a_refused_call_answers_429_with_retry_after(client: FlaskClient, worker: Runtime,
                                                     stream: bool) -> None:
    _set_action(client, "refuse")
    thread, answer = _call_in_thread(lambda: client.post(
        "/v1/chat/completions", headers={"x-slo-ttft-ms": "1"},
        json=CHAT | {"stream": stream}, buffered=True))
    (request_id,) = _submitted(client)

    predict_tasks.annotate(request_id)  # predicts, finds no instance meets 1 ms: refuses
    thread.join(timeout=10)

    error = error_body(answer["response"], 429)
    assert error["code"] == "slo_unmeetable" and error["type"] == "requests"
    assert error["param"] == "slo" and request_id in error["message"]
    assert 1 <= int(answer["response"].headers["Retry-After"]) <= 60
    shown = client.get(f"/v1/requests/{request_id}").get_json()
    assert shown["status"] == "rejected" and shown["error"]["code"] == "slo_unmeetable"
    assert shown["slo"]["met"] is False
    cancelled = error_body(client.post(f"/v1/requests/{request_id}/cancel"), 409)
    assert cancelled["code"] == "request_already_finished"
    scraped = client.get("/metrics").get_data(as_text=True)
    assert 'blockq_slo_requests_total{kind="all",outcome="rejected"}' in scraped


def test_a_stream_refused_after_it_started_ends_with_the_refusal(
        client: FlaskClient, worker: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Routing slower than the stream's wait for it: the stream has begun (200), so the
    refusal is its last event, in the error object's shape."""
    monkeypatch.setattr(openai_api, "ROUTING_WAIT_S", 0.0)
    _set_action(client, "refuse")
    thread, answer = _call_in_thread(lambda: client.post(
        "/v1/chat/completions", headers={"x-slo-e2e-ms": "1"},
        json=CHAT | {"stream": True}, buffered=True))
    (request_id,) = _submitted(client)

    predict_tasks.annotate(request_id)
    thread.join(timeout=10)

    response = answer["response"]
    assert response.status_code == 200
    events = [line.removeprefix("data: ") for line in response.get_data(as_text=True).split(
        "\n") if line.startswith("data: ")]
    last = json.loads(events[-1])
    assert last["error"]["code"] == "slo_unmeetable" and last["error"]["type"] == "requests"


def test_a_meetable_target_is_routed(client: FlaskClient, worker: Runtime) -> None:
    _set_action(client, "refuse")
    created = client.post("/v1/requests", json={"prompt": "Hi", "max_tokens": 4,
                                                "slo": {"ttft_ms": 60_000}})
    request_id = created.get_json()["id"]

    predict_tasks.annotate(request_id)

    shown = client.get(f"/v1/requests/{request_id}").get_json()
    assert shown["status"] == "routed" and shown["instance_id"] == "gpu.0"
    assert shown["routing"]["slo"] == {"met": True}
