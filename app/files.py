"""The Files API's records: upload, look up, list, delete, and the OpenAI File object.

A file is a row in `files` (what the API lists) plus its bytes in the files directory
(`app.storage`). Both belong to one team: another team's file is simply not found.
"""

from __future__ import annotations

import uuid
from pathlib import PurePath
from typing import IO, Any

from sqlalchemy.orm import Session

from app.db import Database
from app.errors import InvalidRequest, NotFound, PayloadTooLarge
from app.models import FilePurpose, StoredFile
from app.pagination import Page, PageQuery, cursor_page
from app.settings import Settings
from app.storage import FileTooLarge, file_store

__all__ = ["new_file_id", "upload_file", "register_file", "get_file", "list_files",
           "delete_file", "file_to_dict", "UPLOAD_PURPOSES"]

#: Purposes a client may upload with; `batch_output` files are written by blockq.
UPLOAD_PURPOSES = frozenset({FilePurpose.BATCH})
MAX_FILENAME_CHARS = 255


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


def upload_file(settings: Settings, db: Database, *, team_id: str, purpose: str | None,
                filename: str | None, stream: IO[bytes]) -> StoredFile:
    """Store an uploaded file (streamed to disk in chunks), then record it."""
    if purpose not in UPLOAD_PURPOSES:
        raise InvalidRequest(f"Invalid purpose '{purpose}': files can be uploaded with purpose "
                             f"{', '.join(sorted(UPLOAD_PURPOSES))}.", param="purpose",
                             code="invalid_value")
    name = PurePath((filename or "").replace("\\", "/")).name[:MAX_FILENAME_CHARS]
    if not name:
        raise InvalidRequest("The upload needs a 'file' part with a file name.", param="file",
                             code="missing_required_parameter")
    store = file_store(settings)
    file_id = new_file_id()
    try:
        size_bytes = store.save(file_id, stream, max_bytes=settings.max_file_bytes)
    except FileTooLarge:
        raise PayloadTooLarge(f"The file is larger than {settings.max_file_bytes} bytes.",
                              param="file", code="file_too_large") from None
    try:
        with db.session() as session:
            return register_file(session, file_id=file_id, team_id=team_id, purpose=purpose,
                                 filename=name, size_bytes=size_bytes)
    except BaseException:
        store.delete(file_id)
        raise


def register_file(session: Session, *, file_id: str, team_id: str, purpose: str, filename: str,
                  size_bytes: int) -> StoredFile:
    """Record a file whose bytes are already stored under `file_id`."""
    row = StoredFile(id=file_id, team_id=team_id, purpose=purpose, filename=filename,
                     size_bytes=size_bytes)
    session.add(row)
    session.flush()
    return row


def get_file(session: Session, file_id: str, *, team_id: str) -> StoredFile:
    row = session.get(StoredFile, file_id)
    if row is None or row.team_id != team_id:
        raise NotFound(f"No such File object: {file_id}", param="id", code="not_found")
    return row


def list_files(session: Session, query: PageQuery, *, team_id: str,
               purpose: str | None) -> Page[StoredFile]:
    where = [StoredFile.team_id == team_id]
    if purpose:
        where.append(StoredFile.purpose == purpose)
    return cursor_page(session, StoredFile, query, where)


def delete_file(settings: Settings, db: Database, file_id: str, *, team_id: str) -> None:
    """Forget the file, then remove its bytes (a reader that has it open finishes reading)."""
    with db.session() as session:
        session.delete(get_file(session, file_id, team_id=team_id))
    file_store(settings).delete(file_id)


def file_to_dict(row: StoredFile) -> dict[str, Any]:
    """OpenAI's File object."""
    return {
        "id": row.id,
        "object": "file",
        "bytes": row.size_bytes,
        "created_at": int(row.created_at.timestamp()),
        "filename": row.filename,
        "purpose": row.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }
