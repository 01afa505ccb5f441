"""GET /v1/instances: every engine instance and its live state."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify
from flask.typing import ResponseReturnValue

from app.api.services import services
from domain.length_bias import FALLBACK_POLICY, fallback_state
from domain.live_fleet import InstanceStatus
from domain.services import Services
from workers.sim.engine_state import EngineState

bp = Blueprint("instances", __name__, url_prefix="/v1")


@bp.get("/instances")
def list_instances() -> ResponseReturnValue:
    """The instances (but those without a heartbeat for instance_expiry_s), and the routing in
    force (the policy, or the bias watch's fallback)."""
    svc = services()
    expiry_s = svc.settings.instance_expiry_s
    # NOTE: the health sweep forgets these; the listing drops them already, sweep or not.
    data = [_instance_to_dict(status) for status in svc.fleet.statuses()
            if status.alive or (status.heartbeat_age_s or 0.0) <= expiry_s]
    return jsonify(object="list", data=data, routing=routing_state(svc))


def routing_state(svc: Services) -> dict[str, Any]:
    """The configured policy, the operator's override, the bias watch's fallback, and which
    one routes now."""
    override = svc.fleet.policy_override()
    fallback = fallback_state(svc.fleet.redis)
    chosen = override or svc.settings.routing_policy
    return {"configured_policy": svc.settings.routing_policy, "override": override,
            "fallback": fallback, "policy": FALLBACK_POLICY if fallback else chosen}


def _instance_to_dict(status: InstanceStatus) -> dict[str, Any]:
    state = status.state
    return {
        "id": status.instance_id,
        "object": "instance",
        "alive": status.alive,
        "accepting": status.accepting,
        "control": status.control,
        "engine_kind": state.engine_kind if state else None,
        "model": state.model if state else None,
        "model_path": (state.model_path or None) if state else None,
        "hardware": (state.hardware or None) if state else None,
        "exec_model": state.exec_model if state else None,
        "capacity_rps": state.capacity_rps if state else None,
        "running": status.num_running,
        "waiting": status.num_waiting,
        "assigned": status.num_assigned,
        "free_kv_blocks": state.num_free_blocks if state else None,
        "total_kv_blocks": state.num_total_blocks if state else None,
        "seconds_since_heartbeat": (
            None if status.heartbeat_age_s is None else round(status.heartbeat_age_s, 3)
        ),
        "config": _engine_config(state),
    }


def _engine_config(state: EngineState | None) -> dict[str, int | None]:
    """The engine's scheduling limits; None each while the instance has published no state."""
    if state is None:
        return dict.fromkeys(("max_num_seqs", "max_num_batched_tokens", "block_size",
                              "max_model_len"))
    return {"max_num_seqs": state.max_num_seqs,
            "max_num_batched_tokens": state.max_num_batched_tokens,
            "block_size": state.block_size, "max_model_len": state.max_model_len}
