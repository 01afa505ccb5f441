"""Latency targets at routing (workers/route/targets.py, domain/slo.py): budgets left at the
decision, what a team's action makes of a decision that meets no target, whether a finished
request met its targets. No services."""

from __future__ import annotations

import dataclasses
import random
from datetime import UTC, datetime, timedelta

import pytest

from domain.slo import RequestTargets, SloMissAction, outcome
from tests.engine_states import engine_state, waiting_request
from workers.route.planner import Plan, plan_route
from workers.route.policies import Decision, FleetLedger, RequestView, RoutingContext, decide
from workers.route.targets import MAX_RETRY_AFTER_S, budgeted, on_miss
from workers.sim import SimRequest, bundled_model
from workers.sim.engine_state import RequestState
from workers.sim.instance_status import InstanceStatus

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
VIEW = RequestView("req_1", num_prompt_tokens=100, predicted_output_tokens=50, max_tokens=256)


def _targets(action: SloMissAction = SloMissAction.ROUTE, *, ttft_ms: float | None = 500.0,
             e2e_ms: float | None = None) -> RequestTargets:
    made = RequestTargets.of(ttft_ms, e2e_ms, action, T0)
    assert made is not None
    return made


def _plan(meets: bool | None, what_ifs: dict[str, tuple[float, float]],
          chosen: str = "gpu.0") -> Plan:
    return Plan(Decision("block", chosen, {i: e2e for i, (_, e2e) in what_ifs.items()},
                         meets_target=meets), what_ifs)


def test_no_targets_no_change() -> None:
    assert RequestTargets.of(None, None, "refuse", T0) is None
    assert budgeted(VIEW, None, T0) is VIEW


def test_budgets_are_what_is_left_since_acceptance() -> None:
    view = budgeted(VIEW, _targets(ttft_ms=500.0, e2e_ms=4000.0), T0 + timedelta(seconds=0.2))
    assert view.ttft_target_s == pytest.approx(0.3)
    assert view.e2e_target_s == pytest.approx(3.8)
    # A target already past is still one, and out of reach (never zero or negative).
    late = budgeted(VIEW, _targets(ttft_ms=500.0), T0 + timedelta(seconds=2))
    assert late.ttft_target_s == pytest.approx(0.001) and late.e2e_target_s is None


def test_a_met_or_unread_target_is_no_miss() -> None:
    view = budgeted(VIEW, _targets(), T0)
    what_ifs = {"gpu.0": (0.1, 1.0)}
    assert on_miss(_plan(True, what_ifs), view, _targets(), first_routing=True,
                   refuse_margin=0) is None
    assert on_miss(_plan(None, {}), view, _targets(), first_routing=True,
                   refuse_margin=0) is None


@pytest.mark.parametrize("action", list(SloMissAction))
def test_a_miss_goes_to_the_closest_instance_and_says_when_to_retry(
        action: SloMissAction) -> None:
    targets = _targets(action, ttft_ms=500.0)
    view = budgeted(VIEW, targets, T0)
    # `decide` chose gpu.1, the closest to the TTFT target (block alone would take gpu.0).
    plan = _plan(False, {"gpu.0": (3.2, 5.0), "gpu.1": (2.1, 9.0)}, chosen="gpu.1")
    miss = on_miss(plan, view, targets, first_routing=True, refuse_margin=0)
    assert miss is not None
    assert (miss.action, miss.instance_id) == (action, "gpu.1")
    assert miss.shortfall == pytest.approx(2.1 / 0.5)
    assert miss.retry_after_s == 2  # 1.6 s past the target, in whole seconds
    assert miss.record()["closest"] == "gpu.1"


def test_refusal_keeps_a_margin_and_spares_re_routed_requests() -> None:
    targets = _targets(SloMissAction.REFUSE, ttft_ms=1000.0)
    view = budgeted(VIEW, targets, T0)
    near = _plan(False, {"gpu.0": (1.2, 5.0)})
    assert on_miss(near, view, targets, first_routing=True,
                   refuse_margin=0.25).action is SloMissAction.ROUTE  # type: ignore[union-attr]
    assert on_miss(near, view, targets, first_routing=True,
                   refuse_margin=0.1).action is SloMissAction.REFUSE  # type: ignore[union-attr]
    # Accepted and started once already (re-routed from a lost instance): routed anyway.
    assert on_miss(near, view, targets, first_routing=False,
                   refuse_margin=0).action is SloMissAction.ROUTE  # type: ignore[union-attr]


def test_retry_after_is_bounded() -> None:
    targets = _targets(SloMissAction.REFUSE, ttft_ms=None, e2e_ms=1000.0)
    view = budgeted(VIEW, targets, T0)
    miss = on_miss(_plan(False, {"gpu.0": (0.1, 900.0)}), view, targets, first_routing=True,
                   refuse_margin=0)
    assert miss is not None and miss.retry_after_s == MAX_RETRY_AFTER_S


def test_outcome_measures_from_acceptance() -> None:
    first, last = T0 + timedelta(milliseconds=300), T0 + timedelta(milliseconds=2500)
    assert outcome(500.0, 2000.0, T0, first, last) == (True, False)
    assert outcome(None, 3000.0, T0, first, last) == (None, True)
    assert outcome(200.0, None, T0, first, last) == (False, None)
    # No first token recorded (nothing generated): the end stands for it.
    assert outcome(3000.0, None, T0, None, last) == (True, None)


def _decoding(num: int, prompt: int, done: int) -> tuple[RequestState, ...]:
    return tuple(RequestState(f"run{i}", prompt, prompt + done, done, 2000, True)
                 for i in range(num))


def test_the_route_stage_and_the_cluster_simulation_pick_the_same_instance_on_a_miss() -> None:
    """One rule for 'no instance meets the targets': the live route stage (plan_route, then
    on_miss) and the cluster simulation (FleetLedger views, then decide) send the request to
    the same instance, the closest to its targets, not the policy's own pick."""
    states = {
        # A queue of long prompts ahead: a late first token, a short run after it.
        "gpu.0": engine_state(*(waiting_request(f"w{i}", 1500, 20) for i in range(6)),
                              num_waiting=6),
        # A full decode batch: a first token at once, a slow run after it.
        "gpu.1": engine_state(*_decoding(30, 3000, 10), num_running=30, num_free_blocks=1500),
    }
    model = bundled_model("qwen2-7b-a30")
    view = RequestView("new", num_prompt_tokens=300, predicted_output_tokens=400,
                       max_tokens=1024, ttft_target_s=0.01)
    # Live: the route stage's plan and its miss.
    candidates = [InstanceStatus(i, alive=True, heartbeat_age_s=0.0, state=s, assigned=())
                  for i, s in states.items()]
    plan = plan_route("block", view, candidates, RoutingContext(0, random.Random(0)), model,
                      now=0.0)
    targets = _targets(ttft_ms=10.0)
    miss = on_miss(plan, view, targets, first_routing=True, refuse_margin=0)
    # Simulated: the cluster simulation's ledger and decision.
    ledger = FleetLedger()
    for instance_id, state in states.items():
        ledger.publish(instance_id, state.to_instance_snapshot(), 0.0)
    planned = SimRequest("new", 300, predicted_output_tokens=400)
    views = ledger.views(planned, model)
    simulated = decide("block", view, views, RoutingContext(0, random.Random(0)))
    assert {v.instance_id: (v.what_if_ttft_s, v.what_if_e2e_s) for v in views} == plan.what_ifs
    assert plan.decision.meets_target is False and simulated.meets_target is False
    assert miss is not None
    assert plan.decision.instance_id == miss.instance_id == simulated.instance_id == "gpu.1"
    # Block alone (no target) takes the shorter end-to-end: gpu.0.
    plain = dataclasses.replace(view, ttft_target_s=None)
    assert decide("block", plain, views, RoutingContext(0, random.Random(0))).instance_id == (
        "gpu.0")
