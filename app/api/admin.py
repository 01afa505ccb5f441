"""Operations endpoints (admin keys only): drain, pause and resume instances, queue depths, the
routing policy in force and switching it at run time, rotating a team's webhook signing secret,
a team's settings (its action on requests whose latency targets no instance can meet)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from flask import Blueprint, jsonify
from flask.typing import ResponseReturnValue
from sqlalchemy.orm import Session

from app.api.auth import current_principal
from app.api.contract import TeamSettingsBody
from app.api.instances import routing_state
from app.api.json_body import json_body
from app.api.services import services
from domain.controls import OperatorControls
from domain.errors import InvalidRequest, NotFound, PermissionDenied, ServiceUnavailable
from domain.live_fleet import InstanceStatus
from domain.models import Team
from domain.queues import SERVICE_QUEUES, queue_depths
from domain.schemas import parse_body
from domain.services import Services
from domain.team_secrets import rotate_secret
from workers.route.policies import POLICIES

bp = Blueprint("admin", __name__, url_prefix="/v1/admin")

#: How long the API waits for workers to answer a remote-control command.
CONTROL_TIMEOUT_S = 2.0


@bp.before_request
def _admins_only() -> None:
    if not current_principal().is_admin:
        raise PermissionDenied("This endpoint needs an admin API key.", code="admin_only")


@bp.get("/queues")
def show_queues() -> ResponseReturnValue:
    """Messages waiting per queue (by priority) and per instance (queued, assigned, running)."""
    svc = services()
    statuses = svc.fleet.statuses()
    depths = queue_depths(svc.fleet.redis, [*SERVICE_QUEUES, *(s.instance_id for s in statuses)])
    queues = [{"queue": name, "waiting": sum(by_priority.values()),
               "by_priority": {str(p): n for p, n in by_priority.items()}}
              for name, by_priority in depths.items()]
    instances = [{"id": s.instance_id, "queued": sum(depths[s.instance_id].values()),
                  "assigned": s.num_assigned, "running": s.num_running,
                  "waiting": s.num_waiting, "control": s.control} for s in statuses]
    return jsonify(object="queues", queues=queues, instances=instances)


@bp.post("/instances/<instance_id>/drain")
def drain(instance_id: str) -> ResponseReturnValue:
    """No new routing to the instance; what it holds or has queued finishes."""
    svc = services()
    _instance(svc, instance_id)
    _controls(svc).hold(instance_id, "drained")
    return jsonify(_instance(svc, instance_id))


@bp.post("/instances/<instance_id>/pause")
def pause(instance_id: str) -> ResponseReturnValue:
    """No new routing, and its engine worker stops taking messages from its queue."""
    svc = services()
    _instance(svc, instance_id)
    workers = _engine_workers(svc, instance_id)
    _controls(svc).hold(instance_id, "paused")
    svc.celery.control.cancel_consumer(instance_id, destination=workers, reply=True,
                                       timeout=CONTROL_TIMEOUT_S)
    return jsonify(_instance(svc, instance_id))


@bp.post("/instances/<instance_id>/resume")
def resume(instance_id: str) -> ResponseReturnValue:
    """Undo drain or pause: the worker consumes its queue again and routing may choose it."""
    svc = services()
    _instance(svc, instance_id)
    workers = _engine_workers(svc, instance_id)
    svc.celery.control.add_consumer(instance_id, destination=workers, reply=True,
                                    timeout=CONTROL_TIMEOUT_S)
    _controls(svc).hold(instance_id, None)
    return jsonify(_instance(svc, instance_id))


@bp.get("/routing")
def show_routing() -> ResponseReturnValue:
    return jsonify(routing_state(services()))


@bp.put("/routing")
def switch_routing() -> ResponseReturnValue:
    """`{"policy": name}` switches every router at once; `{"policy": null}` restores the
    configured one."""
    body = json_body()
    if set(body) != {"policy"}:
        raise InvalidRequest('The body must be {"policy": <name or null>}.', param="policy")
    policy = body["policy"]
    if policy is not None and policy not in POLICIES.names():
        raise InvalidRequest(f"Unknown routing policy '{policy}': one of "
                             f"{', '.join(POLICIES.names())}.", param="policy",
                             code="unknown_policy")
    svc = services()
    _controls(svc).set_policy_override(policy)
    return jsonify(routing_state(svc))


@bp.post("/teams/<team_id>/webhook_secret/rotate")
def rotate_webhook_secret(team_id: str) -> ResponseReturnValue:
    """A new signing secret for the team's webhook events, returned once; the current one still
    signs events for `webhook_secret_grace_s` (events carry both signatures meanwhile)."""
    svc = services()
    with svc.db.session() as session:
        team = session.get(Team, team_id)
        if team is None:
            raise NotFound(f"No team with id '{team_id}'.", param="team_id",
                           code="team_not_found")
        rotated = rotate_secret(session, team,
                                grace=timedelta(seconds=svc.settings.webhook_secret_grace_s))
    until = rotated.previous_valid_until
    return jsonify(object="team.webhook_secret", team_id=team_id, secret=rotated.secret,
                   previous_valid_until=int(until.timestamp()) if until else None)


@bp.get("/teams/<team_id>")
def show_team(team_id: str) -> ResponseReturnValue:
    with services().db.session() as session:
        return jsonify(_team_object(_team(session, team_id)))


@bp.patch("/teams/<team_id>")
def update_team(team_id: str) -> ResponseReturnValue:
    """Change a team's settings: `{"slo_miss_action": "route" | "queue" | "refuse"}`. Requests
    already accepted keep the action they were accepted with."""
    changes = parse_body(TeamSettingsBody, json_body())
    with services().db.session() as session:
        team = _team(session, team_id)
        team.slo_miss_action = changes.slo_miss_action
        session.flush()
        return jsonify(_team_object(team))


def _team(session: Session, team_id: str) -> Team:
    team = session.get(Team, team_id)
    if team is None:
        raise NotFound(f"No team with id '{team_id}'.", param="team_id", code="team_not_found")
    return team


def _team_object(team: Team) -> dict[str, Any]:
    return {"id": team.id, "object": "team", "name": team.name, "share": team.share,
            "rate_limit_rpm": team.rate_limit_rpm, "slo_miss_action": team.slo_miss_action}


def _controls(svc: Services) -> OperatorControls:
    return OperatorControls(svc.db, svc.fleet)


def _instance(svc: Services, instance_id: str) -> dict[str, Any]:
    found: InstanceStatus | None = next(
        (s for s in svc.fleet.statuses() if s.instance_id == instance_id), None)
    if found is None:
        raise NotFound(f"No instance '{instance_id}'.", param="instance_id", code="not_found")
    return {"id": found.instance_id, "object": "instance", "alive": found.alive,
            "accepting": found.accepting, "control": found.control}


def _engine_workers(svc: Services, instance_id: str) -> list[str]:
    """Node names of the Celery workers that host the instance (`gpu.<k>@<host>`)."""
    replies = svc.celery.control.ping(timeout=CONTROL_TIMEOUT_S) or []
    names = [name for reply in replies for name in reply if name.split("@")[0] == instance_id]
    if not names:
        raise ServiceUnavailable(f"No running worker hosts '{instance_id}'.",
                                 code="worker_unreachable")
    return names
