"""The Batch API (OpenAI's /v1/batches): create, show, list, cancel."""

from __future__ import annotations

from flask import Blueprint, jsonify, request
from flask.typing import ResponseReturnValue

from app.api.auth import current_principal
from app.api.json_body import json_body
from app.api.services import services
from domain import batches
from domain.pagination import list_object, page_query

bp = Blueprint("batches", __name__, url_prefix="/v1/batches")

#: OpenAI's limits of GET /v1/batches.
DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT = 20, 100


@bp.post("")
def create() -> ResponseReturnValue:
    body = json_body()
    batch = batches.create_batch(services(), body, team_id=current_principal().team_id)
    return show(batch.id)


@bp.get("/<batch_id>")
def show(batch_id: str) -> ResponseReturnValue:
    with services().db.session() as session:
        batch = batches.get_batch(session, batch_id, team_id=current_principal().team_id)
        counts = batches.line_counts(session, [batch.id])[batch.id]
        estimates = batches.batch_estimates(services().fleet.redis, [batch.id])
        return jsonify(batches.batch_to_dict(batch, counts, estimates.get(batch.id)))


@bp.get("")
def index() -> ResponseReturnValue:
    query = page_query(request.args, default_limit=DEFAULT_LIST_LIMIT, max_limit=MAX_LIST_LIMIT)
    with services().db.session() as session:
        page = batches.list_batches(session, query, team_id=current_principal().team_id)
        counts = batches.line_counts(session, [b.id for b in page.items])
        estimates = batches.batch_estimates(services().fleet.redis, [b.id for b in page.items])
        data = [batches.batch_to_dict(b, counts[b.id], estimates.get(b.id))
                for b in page.items]
    return jsonify(list_object(data, has_more=page.has_more))


@bp.post("/<batch_id>/cancel")
def cancel(batch_id: str) -> ResponseReturnValue:
    batches.cancel_batch(services(), batch_id, team_id=current_principal().team_id)
    return show(batch_id)
