"""The route stage: read the request, plan the decision on the fleet's published states, record
it. The route task (`tasks.py`) calls these in order and publishes to the chosen queue after the
decision committed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, cast

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from domain import model_registry, request_store
from domain.db import Database
from domain.models import InferenceRequest, Priority, RequestStatus, utcnow
from domain.settings import Settings
from domain.slo import REJECTED_CODE
from workers import runtime
from workers.active_model import ActiveModel
from workers.route.late_binding import LateBinding
from workers.route.pipeline import Routed, RouteRequest, RoutingRules
from workers.route.planner import Candidate, Plan
from workers.route.policies import RequestView
from workers.route.targets import Miss, RequestTargets
from workers.runtime import Runtime
from workers.sim import ExecModel, bundled_model, bundled_model_names, exec_model_of
from workers.sim.exec_model import is_exec_model
from workers.sim.instance_status import InstanceStatus

__all__ = ["DEFAULT_EXEC_MODEL", "ExecModels", "exec_models", "RouteInput", "load",
           "models_by_id", "prompt_token_ids", "routing_rules", "route_request_of",
           "routing_record", "record", "Refused", "reject", "overhead"]

logger = logging.getLogger(__name__)

DEFAULT_EXEC_MODEL = "qwen2-7b-a30"
#: Late binding: held requests one release looks at, oldest first (and the most a just-published
#: instance may take out of order: `LateBinding.overtake_scan`).
RELEASE_SCAN = 16


class ExecModels:
    """Each instance's active execution-time model (refit from its own steps, hot-reloaded),
    else the routing default: what block policies simulate instances with."""

    def __init__(self, rt: Runtime) -> None:
        self.db, self.settings = rt.db, rt.settings
        self._by_instance: dict[str, ActiveModel[ExecModel]] = {}
        self._lock = threading.Lock()

    @cached_property
    def default(self) -> ExecModel:
        s = self.settings
        name = s.routing_exec_model or (
            s.emulated_exec_model if s.engine_kind == "emulated" else DEFAULT_EXEC_MODEL)
        if name in bundled_model_names():
            return bundled_model(name)
        return ExecModel.load(Path(name))

    def for_candidates(self, candidates: Sequence[Candidate]) -> dict[str, ExecModel]:
        """Each candidate's model, from what its published state declares."""
        statuses = cast(Sequence[InstanceStatus], candidates)  # production's candidates
        return self.of((s.instance_id for s in statuses),
                       {s.instance_id: s.state.exec_model for s in statuses
                        if s.state is not None})

    def of(self, instance_ids: Iterable[str],
           declared: Mapping[str, str | None] | None = None) -> dict[str, ExecModel]:
        """`declared`: instance -> the execution-time model it declares (an emulated
        instance's hardware), its default until a refit of its own is active."""
        declared = declared or {}
        return {i: self._active(i, declared.get(i)).get() for i in instance_ids}

    def _active(self, instance_id: str, declared: str | None = None) -> ActiveModel[ExecModel]:
        with self._lock:
            if instance_id not in self._by_instance:
                default = (self._bundled(declared) if declared and is_exec_model(declared)
                           and self.settings.routing_exec_model is None else None)
                self._by_instance[instance_id] = ActiveModel(
                    self.db, model_registry.KIND_EXEC, instance_id, load=_exec_model_of,
                    default=(lambda: self.default) if default is None else default,
                    interval_s=self.settings.model_reload_interval_s)
            return self._by_instance[instance_id]

    @staticmethod
    def _bundled(name: str) -> Callable[[], ExecModel]:
        model = exec_model_of(name)
        return lambda: model


def exec_models(rt: Runtime) -> ExecModels:
    return rt.component(ExecModels)


@dataclass(frozen=True, slots=True)
class RouteInput:
    """A request as the route stage found it."""

    view: RequestView
    priority: int  # Priority.rank, for the queues
    status: RequestStatus
    instance_id: str | None  # set when already routed
    attempt: int
    # Its latency targets and its team's action on a miss (domain/slo.py); None without.
    targets: RequestTargets | None = None
    # Its session (domain/sessions.py): the router prefers the instance of its previous turn.
    session_key: str | None = None
    # The served model it asked for: only that model's instances are candidates (None: a
    # request stored before models were recorded, the default model's).
    model: str | None = None


def load(db: Database, request_id: str) -> RouteInput | None:
    with db.session() as session:
        request = session.get(InferenceRequest, request_id)
        if request is None:
            return None
        return RouteInput(
            view=RequestView(
                request_id=request.id,
                num_prompt_tokens=request.prompt_tokens,
                predicted_output_tokens=request.predicted_output_tokens,
                max_tokens=request.max_tokens,
                prompt_token_ids=prompt_token_ids(runtime.get(), request.prompt,
                                                  request.prompt_token_ids),
                priority_class=Priority(request.priority).rank,
            ),
            priority=Priority(request.priority).rank,
            status=RequestStatus(request.status),
            instance_id=request.instance_id,
            attempt=request.attempt,
            targets=RequestTargets.of(request.slo_ttft_ms, request.slo_e2e_ms,
                                      request.slo_miss_action, request.created_at),
            session_key=request.session_key,
            model=request.model,
        )


def models_by_id(db: Database, request_ids: Collection[str]) -> dict[str, str | None]:
    """The model each request asked for (None: a request stored before models were)."""
    with db.session() as session:
        rows = session.execute(select(InferenceRequest.id, InferenceRequest.model).where(
            InferenceRequest.id.in_(list(request_ids))))
        return {request_id: model for request_id, model in rows}


def routing_rules(settings: Settings) -> RoutingRules:
    """The decision pipeline's rules from the settings (read here, in one place)."""
    late_binding = LateBinding(max_queueing_s=settings.routing_hold_max_queueing_s,
                               overtake_s=settings.routing_hold_overtake_s,
                               overtake_scan=RELEASE_SCAN) if settings.routing_hold else None
    return RoutingRules(
        policy=settings.routing_policy_for(mixed_hardware=False),
        mixed_fleet_policy=settings.routing_policy_for(mixed_hardware=True),
        late_binding=late_binding, hold_max_s=settings.routing_hold_max_s,
        refuse_margin=settings.slo_refuse_margin,
        affinity_margin=settings.session_affinity_margin)


def route_request_of(request: RouteInput, *, session: bool, preferred: str | None,
                     held_since: float | None) -> RouteRequest:
    """The stored request as the decision pipeline reads it."""
    return RouteRequest(view=request.view, model=request.model, targets=request.targets,
                        first_routing=request.attempt == 0, session=session,
                        preferred=preferred, held_since=held_since)


def prompt_token_ids(rt: Runtime, prompt: str,
                     token_ids: Sequence[int] | None) -> tuple[int, ...] | None:
    """A request's prompt token ids for prefix-cache-aware routing (`RequestView`): the ids the
    client gave, else the served model's tokenization of its text, as emulated engines hash
    it; None when engines run without prefix caching."""
    if not rt.settings.engine_prefix_caching:
        return None
    if token_ids is not None:
        return tuple(int(t) for t in token_ids)
    return tuple(rt.prompts.token_ids(prompt))


def routing_record(outcome: Routed, decision_ms: float, timing: dict[str, float],
                   route_started_at: float, held_since: float | None = None) -> dict[str, Any]:
    """What the request's `routing` column keeps of the decision."""
    plan = outcome.plan
    routing: dict[str, Any] = {
        "scores": plan.decision.scores,
        "what_ifs": plan.what_ifs,
        "decision_ms": round(decision_ms, 3),
    }
    if outcome.fallback:
        routing["fallback"] = dict(outcome.fallback)
    if timing.get("in_api"):
        routing["routed_in"] = "api"  # not by the predict task (workers/predict/inline.py)
    routing.update(overhead(timing, route_started_at))
    if outcome.view.has_target:
        routing["slo"] = (outcome.miss.record() if outcome.miss is not None
                          else {"met": plan.decision.meets_target})
    if outcome.affinity is not None:
        routing["affinity"] = outcome.affinity.record()
    if held_since is not None:
        routing["held_s"] = round(time.time() - held_since, 3)
    return routing


def record(session: Session, request_id: str, plan: Plan, routing: dict[str, Any], *,
           fallback: bool,
           allowed_from: Collection[RequestStatus] = (RequestStatus.QUEUED,
                                                      RequestStatus.PREDICTING),
           note: str = "",
           **columns: Any) -> int | None:
    """Write the decision (status routed, attempt + 1, and `columns` in the same UPDATE); the
    new attempt, or None when the request left `allowed_from` meanwhile. `note` ends the
    event's detail."""
    decision = plan.decision
    ttft_s, e2e_s = plan.what_ifs.get(decision.instance_id, (None, None))
    routed = request_store.transition_returning(
        session,
        request_id,
        RequestStatus.ROUTED,
        allowed_from=allowed_from,
        detail=f"{decision.policy}{' (fallback)' if fallback else ''} -> "
        f"{decision.instance_id}{note}",
        instance_id=decision.instance_id,
        policy=decision.policy,
        routing=routing,
        predicted_ttft_s=ttft_s,
        predicted_e2e_s=e2e_s,
        routed_at=utcnow(),
        attempt=InferenceRequest.attempt + 1,
        returning=(InferenceRequest.attempt,),
        **columns,
    )
    return None if routed is None else int(routed.attempt)


@dataclass(frozen=True, slots=True)
class Refused:
    """A request refused at routing: what its waiters and its webhook need."""

    message: str
    webhook_url: str | None
    attempt: int


def reject(session: Session, request_id: str, plan: Plan, routing: dict[str, Any], miss: Miss,
           *, allowed_from: Collection[RequestStatus], **columns: Any) -> Refused | None:
    """End the request `rejected`: no instance's what-if met its latency targets and its team
    refuses such requests. The error says why and when to retry. None when the request left
    `allowed_from` meanwhile (cancelled)."""
    message = (f"No instance can meet this request's latency targets now: the closest "
               f"({miss.instance_id}) predicts a first token in {miss.ttft_s * 1000:.0f} ms and "
               f"the end in {miss.e2e_s * 1000:.0f} ms. Retry in {miss.retry_after_s} s.")
    rejected = request_store.transition_returning(
        session,
        request_id,
        RequestStatus.REJECTED,
        allowed_from=allowed_from,
        detail=f"{plan.decision.policy}: latency targets unmeetable (x{miss.shortfall:.2f})",
        policy=plan.decision.policy,
        routing=routing,
        error={"type": "requests", "code": REJECTED_CODE, "message": message,
               "retry_after_s": miss.retry_after_s,
               "predicted_ttft_ms": round(miss.ttft_s * 1000, 1),
               "predicted_e2e_ms": round(miss.e2e_s * 1000, 1)},
        finished_at=utcnow(),
        returning=(InferenceRequest.webhook_url, InferenceRequest.attempt),
        **columns,
    )
    if rejected is None:
        return None
    return Refused(message, rejected.webhook_url, int(rejected.attempt))


def overhead(timing: dict[str, float], route_started_at: float) -> dict[str, object]:
    """Overhead from entering predict to now (the publish follows the decision's commit at
    once), with its stages: predict, the hand-off through the broker, and the route task."""
    started, predicted = timing.get("predict_started_at"), timing.get("predicted_at")
    if started is None or predicted is None:
        return {}
    now = time.time()
    return {
        "overhead_ms": round((now - started) * 1000, 3),
        "stages_ms": {
            "predict": round((predicted - started) * 1000, 3),
            "handoff": round((route_started_at - predicted) * 1000, 3),
            "route": round((now - route_started_at) * 1000, 3),
        },
    }


def _exec_model_of(artifact: bytes) -> ExecModel:
    return ExecModel.from_dict(json.loads(artifact))


# -- session affinity (the decision itself: workers/route/affinity.py) --------------------------

def _session_redis_key(session_key: str) -> str:
    return f"blockq:session:{session_key}:instance"


def last_instance(client: redis.Redis, session_key: str) -> str | None:
    """The instance that served the session's last turn, if remembered; None also when Redis
    does not answer (the request is routed without affinity)."""
    try:
        value = client.get(_session_redis_key(session_key))
    except redis.RedisError:
        logger.warning("session affinity skipped: Redis did not answer")
        return None
    return value.decode() if isinstance(value, bytes) else value


def remember_instance(client: redis.Redis, session_key: str, instance_id: str,
                      ttl_s: float) -> None:
    """Remember that the session's last turn went to `instance_id`, for `ttl_s` seconds (best
    effort: a lost write costs the next turn its affinity, nothing else)."""
    try:
        client.set(_session_redis_key(session_key), instance_id, px=max(int(ttl_s * 1000), 1))
    except redis.RedisError:
        logger.warning("could not remember the session's instance")
