"""One routing decision, wherever it is made: a recorded sequence of fleet states and requests,
replayed through the route task (Celery's path), the API's own routing of held completions and
the cluster simulation's router, gives the same decisions on all three.

The fleet is two A30s and two A100s (unlike hardware: the mixed-fleet policy, block_slo, by
default) with uneven loads; the requests come in rounds, each round after a publication in
which every instance shows the requests that path routed to it before. Real PostgreSQL and
Redis for the two production paths.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import update

from domain import dispatch, request_store
from domain.models import InferenceRequest
from domain.settings import Settings
from tests.engine_states import engine_state, waiting_request
from tests.workers.request_rows import REQUEST_FIELDS, stored_request
from workers.cluster_sim.simulation import ClusterSetup, FleetMember, RoutedFleet, RoutedRequest
from workers.predict import stage as predict_stage
from workers.predict.inline import InlineRouter
from workers.route import tasks as route_tasks
from workers.route.pipeline import Routed
from workers.route.policies import RequestView
from workers.route.stage import routing_rules
from workers.runtime import Runtime
from workers.sim import SimRequest, bundled_model
from workers.sim.engine_state import EngineState, RequestState

MODEL = "emulated/llama-2-7b"
HARDWARE = {"gpu.0": "llama-2-7b-a30", "gpu.1": "llama-2-7b-a30",
            "gpu.2": "llama-2-7b-a100", "gpu.3": "llama-2-7b-a100"}
#: Per round, each instance's own load (running requests: prompt, computed, output, predicted).
LOADS = [
    {"gpu.0": [(900, 900, 40, 300)] * 6, "gpu.1": [], "gpu.2": [(1500, 1500, 10, 600)] * 20,
     "gpu.3": [(400, 400, 5, 200)] * 3},
    {"gpu.0": [(900, 900, 140, 300)] * 4, "gpu.1": [(2000, 2000, 1, 400)] * 8,
     "gpu.2": [(1500, 1500, 300, 600)] * 12, "gpu.3": []},
    {"gpu.0": [], "gpu.1": [(2000, 2000, 200, 400)] * 20, "gpu.2": [(700, 700, 50, 100)] * 2,
     "gpu.3": [(3000, 3000, 20, 500)] * 10},
]
#: Per round, the requests routed after the publication: (prompt tokens, predicted tokens).
ROUNDS = [[(120, 40), (3000, 400), (800, 900), (60, 20), (1500, 250)],
          [(2500, 100), (300, 600), (90, 30), (1200, 1200)],
          [(40, 10), (3500, 700), (600, 300), (200, 50), (2200, 80)]]
MAX_TOKENS = 2048


def _running(instance: str, k: int, load: tuple[int, int, int, int]) -> RequestState:
    prompt, computed, output, predicted = load
    return RequestState(f"{instance}-run{k}", prompt, num_computed_tokens=computed + output,
                        num_output_tokens=output, predicted_output_tokens=predicted,
                        is_running=True)


def _state(round_index: int, instance: str, routed: list[tuple[str, int, int]]) -> EngineState:
    """The instance's state at the round's publication: its own load, then the requests this
    path routed to it before, waiting."""
    running = [_running(instance, k, load)
               for k, load in enumerate(LOADS[round_index][instance])]
    waiting = [waiting_request(request_id, prompt, predicted)
               for request_id, prompt, predicted in routed]
    used = sum(-(-(r.num_prompt_tokens + r.num_output_tokens) // 16) for r in running)
    return engine_state(*running, *waiting, model=MODEL, exec_model=HARDWARE[instance],
                        hardware=HARDWARE[instance].rsplit("-", 1)[1],
                        num_running=len(running), num_waiting=len(waiting),
                        num_total_blocks=4000, num_free_blocks=4000 - used, max_num_seqs=48,
                        taken_at=float(round_index))


#: Routes one recorded request: (step, recorded id, prompt, predicted) -> (instance, its id).
Replay = Callable[[int, str, int, int], tuple[str, str]]


def _replay(publish: Callable[[str, EngineState, float], None], route: Replay) -> list[str]:
    """Run the recorded sequence through one path; the instance of each decision, in order."""
    routed: dict[str, list[tuple[str, int, int]]] = {i: [] for i in HARDWARE}
    chosen = []
    for round_index, requests in enumerate(ROUNDS):
        for instance in HARDWARE:
            publish(instance, _state(round_index, instance, routed[instance]),
                    float(round_index))
        for k, (prompt, predicted) in enumerate(requests):
            request_id = f"r{round_index}-{k}"
            instance, stored_id = route(round_index * 10 + k, request_id, prompt, predicted)
            routed[instance].append((stored_id, prompt, predicted))
            chosen.append(instance)
    return chosen


def _simulated(policy_override: str | None, settings: Settings) -> list[str]:
    """The simulator's router on the recording (its ledger fed the recorded states), with the
    operator's override as production reads it from Redis."""
    rules = routing_rules(settings)
    if policy_override is not None:
        rules = dataclasses.replace(rules, policy=policy_override,
                                    mixed_fleet_policy=policy_override)
    members = [FleetMember(_state(0, i, []).instance_config(), bundled_model(HARDWARE[i]))
               for i in HARDWARE]
    fleet = RoutedFleet(ClusterSetup.of_fleet(members), rules, seed=0)

    def publish(instance: str, state: EngineState, at: float) -> None:
        fleet.ledger.publish(instance, state.to_instance_snapshot(), at)

    def route(step: int, request_id: str, prompt: int, predicted: int) -> tuple[str, str]:
        now = step / 10 + 0.05
        view = RequestView(request_id, prompt, predicted, max_tokens=MAX_TOKENS)
        outcome = fleet.decide(RoutedRequest(None, None, view), now)  # type: ignore[arg-type]
        assert isinstance(outcome, Routed)
        fleet.ledger.assign(outcome.instance_id,
                            SimRequest(request_id, prompt, predicted_output_tokens=predicted),
                            now)
        return outcome.instance_id, request_id

    return _replay(publish, route)


def _stored(rt: Runtime, request_id: str, prompt: int, predicted: int,
            ) -> tuple[InferenceRequest, tuple[int, dispatch.Message]]:
    """A request stored as the API stores a held completion (its predict message deferred),
    with the recorded prompt length and, already, the recorded prediction."""
    with rt.outbox.transaction() as tx:
        (request,) = request_store.create_requests(tx.session, [REQUEST_FIELDS | {
            "prompt": f"request {request_id}", "model": MODEL, "prompt_tokens": prompt,
            "max_tokens": MAX_TOKENS}])
        tx.post(dispatch.predict(request.id, priority=0), defer=True)
    (entry,) = tx.deferred
    return request, entry


def _predicting_as_recorded(rt: Runtime, request_id: str, predicted: int) -> None:
    with rt.db.session() as session:
        session.execute(update(InferenceRequest).where(InferenceRequest.id == request_id)
                        .values(predicted_output_tokens=predicted))


@pytest.fixture
def production(configure_worker: Callable[..., Runtime]) -> Callable[..., Runtime]:
    def make(policy_override: str | None) -> Runtime:
        rt = configure_worker(route_in_api=True, length_predictor="baseline",
                              bias_correction_rate=0.0, heartbeat_ttl_s=600.0)
        rt.redis.flushdb()
        if policy_override is not None:
            rt.fleet.set_policy_override(policy_override)
        return rt

    return make


def _publisher(rt: Runtime) -> Callable[[str, EngineState, float], None]:
    def publish(instance: str, state: EngineState, at: float) -> None:
        rt.fleet.publish(instance, state)

    return publish


def _through_the_route_task(rt: Runtime) -> list[str]:
    def route(step: int, request_id: str, prompt: int, predicted: int) -> tuple[str, str]:
        request, _ = _stored(rt, request_id, prompt, predicted)
        _predicting_as_recorded(rt, request.id, predicted)
        route_tasks.route(request.id)
        row = stored_request(rt.db, request.id)
        assert row.instance_id is not None
        return row.instance_id, request.id

    return _replay(_publisher(rt), route)


def _through_the_api(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    router = InlineRouter(rt.settings, db=rt.db, redis=rt.redis, fleet=rt.fleet,
                          celery=rt.celery, outbox=rt.outbox)
    recorded: dict[str, int] = {}
    predictor = _api_predictor(router)
    predict = predictor.predict

    def as_recorded(query: Any) -> Any:
        # NOTE: the API predicts with its own head; the recording fixes the length instead,
        # so that the three paths decide on the same inputs.
        return dataclasses.replace(predict(query), tokens=recorded[query.prompt])

    monkeypatch.setattr(predictor, "predict", as_recorded)

    def route(step: int, request_id: str, prompt: int, predicted: int) -> tuple[str, str]:
        request, entry = _stored(rt, request_id, prompt, predicted)
        recorded[request.prompt] = predicted
        assert router.route(request, entry)
        instance = stored_request(rt.db, request.id).instance_id
        assert instance is not None
        return instance, request.id

    return _replay(_publisher(rt), route)


def _api_predictor(router: InlineRouter) -> Any:
    return predict_stage.length_predictor(router.rt, predict_stage.HEAD_FAST)


@pytest.mark.parametrize("policy_override", [None, "block"])
def test_the_route_task_the_api_and_the_simulator_decide_alike(
        production: Callable[..., Runtime], fresh_services: Settings,
        monkeypatch: pytest.MonkeyPatch, policy_override: str | None) -> None:
    simulated = _simulated(policy_override, fresh_services)
    by_task = _through_the_route_task(production(policy_override))
    by_api = _through_the_api(production(policy_override), monkeypatch)

    assert by_task == simulated
    assert by_api == simulated
    # The recording makes the decision matter: it spreads over the fleet.
    assert len(set(simulated)) >= 3
