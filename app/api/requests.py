"""The native requests API: submit, poll, cancel."""

from __future__ import annotations

from flask import Blueprint, jsonify, request, url_for
from flask.typing import ResponseReturnValue

from app.api.auth import current_principal
from app.api.json_body import json_body
from app.api.services import services
from domain import request_store
from domain.commands import cancel_request, submit_request
from domain.sessions import session_from_headers

bp = Blueprint("requests", __name__, url_prefix="/v1/requests")


@bp.post("")
def create() -> ResponseReturnValue:
    body = json_body()
    principal = current_principal()
    created_request, created = submit_request(
        services(), body, idempotency_key=request.headers.get("Idempotency-Key"),
        team_id=principal.team_id, slo_miss_action=principal.slo_miss_action,
        session_id=session_from_headers(request.headers),
    )
    status_url = url_for("requests.show", request_id=created_request.id, _external=True)
    payload = {
        "id": created_request.id,
        "object": "request",
        "status": created_request.status,
        "status_url": status_url,
        "created": created,
    }
    return jsonify(payload), 202, {"Location": status_url}


@bp.get("/<request_id>")
def show(request_id: str) -> ResponseReturnValue:
    with services().db.session() as session:
        found = request_store.get_request(session, request_id, team_id=current_principal().team_id)
        return jsonify(request_store.request_to_dict(found))


@bp.post("/<request_id>/cancel")
def cancel(request_id: str) -> ResponseReturnValue:
    cancel_request(services(), request_id, team_id=current_principal().team_id)
    return show(request_id)
