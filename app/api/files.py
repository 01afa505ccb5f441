"""The Files API (OpenAI's /v1/files): upload, list, show, download, delete."""

from __future__ import annotations

from flask import Blueprint, jsonify, request, send_file
from flask.typing import ResponseReturnValue

from app.api.auth import current_principal
from app.api.services import services
from domain import file_records
from domain.errors import InvalidRequest, NotFound
from domain.file_bytes import file_store
from domain.file_quota import expires_after_of_form
from domain.pagination import list_object, page_query

bp = Blueprint("files", __name__, url_prefix="/v1/files")

#: Room for the multipart envelope (boundaries, part headers, the purpose field).
MULTIPART_OVERHEAD_BYTES = 64 * 1024
#: OpenAI's limits of GET /v1/file_records.
MAX_LIST_LIMIT = 10_000


@bp.post("")
def upload() -> ResponseReturnValue:
    settings = services().settings
    # NOTE: the app-wide body limit is for JSON; an upload may be as large as a file may be.
    # Werkzeug parses the multipart body as it arrives and spools a file part to a temporary
    # file on disk; domain.file_bytes then copies it into the files directory in chunks.
    request.max_content_length = settings.max_file_bytes + MULTIPART_OVERHEAD_BYTES
    if not request.mimetype.startswith("multipart/form-data"):
        raise InvalidRequest("Upload files as multipart/form-data with parts 'file' and "
                             "'purpose'.", param="file", code="invalid_value")
    upload_part = request.files.get("file")
    if upload_part is None:
        raise InvalidRequest("Missing the 'file' part.", param="file",
                             code="missing_required_parameter")
    row = file_records.upload_file(settings, services().db, team_id=current_principal().team_id,
                            purpose=request.form.get("purpose"), filename=upload_part.filename,
                            stream=upload_part.stream,
                            expires_after_s=expires_after_of_form(request.form))
    return jsonify(file_records.file_to_dict(row))


@bp.get("")
def index() -> ResponseReturnValue:
    query = page_query(request.args, default_limit=MAX_LIST_LIMIT, max_limit=MAX_LIST_LIMIT,
                       orders=("desc", "asc"))
    with services().db.session() as session:
        page = file_records.list_files(session, query, team_id=current_principal().team_id,
                                purpose=request.args.get("purpose") or None)
        data = [file_records.file_to_dict(row) for row in page.items]
    return jsonify(list_object(data, has_more=page.has_more))


@bp.get("/<file_id>")
def show(file_id: str) -> ResponseReturnValue:
    with services().db.session() as session:
        return jsonify(file_records.file_to_dict(
            file_records.get_file(session, file_id, team_id=current_principal().team_id)))


@bp.get("/<file_id>/content")
def content(file_id: str) -> ResponseReturnValue:
    with services().db.session() as session:
        row = file_records.get_file(session, file_id, team_id=current_principal().team_id)
    store = file_store(services().settings, services().db)
    try:
        handle = store.open(row.id)
    except FileNotFoundError:
        raise NotFound(f"No such File object: {file_id}", param="id", code="not_found") from None
    return send_file(handle, mimetype="application/octet-stream", download_name=row.filename,
                     max_age=0)


@bp.delete("/<file_id>")
def delete(file_id: str) -> ResponseReturnValue:
    file_records.delete_file(services().settings, services().db, file_id,
                      team_id=current_principal().team_id)
    return jsonify({"id": file_id, "object": "file", "deleted": True})
