"""The Files API's records: upload, look up, list, delete, and the OpenAI File object.

A file is a row in `files` (what the API lists) plus its bytes in the files directory or the
database (`domain.file_bytes`). Both belong to one team: another team's file is simply not found.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from pathlib import PurePath
from typing import IO, Any

from sqlalchemy import or_
from sqlalchemy.orm import Session

from domain import batch_input
from domain.db import Database
from domain.errors import InvalidRequest, NotFound, PayloadTooLarge
from domain.file_bytes import FileTooLarge, file_store
from domain.file_quota import check_quota, expires_at_of
from domain.models import FilePurpose, StoredFile, utcnow
from domain.pagination import Page, PageQuery, cursor_page
from domain.settings import Settings

__all__ = ["new_file_id", "upload_file", "register_file", "get_file", "list_files",
           "delete_file", "file_to_dict", "UPLOAD_PURPOSES"]

#: Purposes a client may upload with; `batch_output` files are written by blockq.
UPLOAD_PURPOSES = frozenset({FilePurpose.BATCH})
MAX_FILENAME_CHARS = 255
#: C0 controls (NUL, CR, LF...), DEL, C1 controls and lone surrogates: never in a file name.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


def upload_file(settings: Settings, db: Database, *, team_id: str, purpose: str | None,
                filename: str | None, stream: IO[bytes],
                expires_after_s: int | None = None) -> StoredFile:
    """Store an uploaded file (streamed to disk in chunks), then record it if it fits in the
    team's storage quota (domain.file_quota); it expires `expires_after_s` after creation."""
    if purpose not in UPLOAD_PURPOSES:
        raise InvalidRequest(f"Invalid purpose '{purpose}': files can be uploaded with purpose "
                             f"{', '.join(sorted(UPLOAD_PURPOSES))}.", param="purpose",
                             code="invalid_value")
    name = upload_name(filename)
    store = file_store(settings, db)
    file_id = new_file_id()
    max_bytes = batch_input.max_upload_bytes(settings, purpose)
    try:
        size_bytes = store.save(file_id, stream, max_bytes=max_bytes)
    except FileTooLarge:
        raise PayloadTooLarge(f"The file is larger than {max_bytes} bytes.",
                              param="file", code="file_too_large") from None
    try:
        if size_bytes == 0:
            raise InvalidRequest("The file is empty.", param="file", code="empty_file")
        if purpose == FilePurpose.BATCH:
            batch_input.check_request_count(settings, lambda: store.open(file_id),
                                            param="file")
        with db.session() as session:
            check_quota(session, settings, team_id=team_id, adding=size_bytes)
            now = utcnow()
            return register_file(session, file_id=file_id, team_id=team_id, purpose=purpose,
                                 filename=name, size_bytes=size_bytes, created_at=now,
                                 expires_at=expires_at_of(now, expires_after_s))
    except BaseException:
        store.delete(file_id)
        raise


def upload_name(filename: str | None) -> str:
    """The name an upload is listed under: its last path segment (a client's directories are
    none of ours); refused when empty, longer than MAX_FILENAME_CHARS, `.`/`..`, or holding a
    control character (NUL, CR, LF: also as `filename*=UTF-8''a%0D%0A`) or a lone surrogate."""
    name = PurePath((filename or "").replace("\\", "/")).name
    if not name or name in (".", ".."):
        raise InvalidRequest("The upload needs a 'file' part with a file name.", param="file",
                             code="missing_required_parameter")
    if len(name) > MAX_FILENAME_CHARS:
        raise InvalidRequest(f"The file name is {len(name)} characters; at most "
                             f"{MAX_FILENAME_CHARS} are accepted.", param="file",
                             code="invalid_filename")
    if (bad := _UNPRINTABLE.search(name)) is not None:
        raise InvalidRequest(f"The file name holds U+{ord(bad.group()):04X} at position "
                             f"{bad.start()}: no control character (NUL, CR, LF...) or lone "
                             "surrogate may be part of a file name.", param="file",
                             code="invalid_filename")
    return name


def register_file(session: Session, *, file_id: str, team_id: str, purpose: str, filename: str,
                  size_bytes: int, created_at: datetime | None = None,
                  expires_at: datetime | None = None) -> StoredFile:
    """Record a file whose bytes are already stored under `file_id`; the retention purge
    deletes it (row and bytes) once `expires_at` has passed."""
    row = StoredFile(id=file_id, team_id=team_id, purpose=purpose, filename=filename,
                     size_bytes=size_bytes, created_at=created_at or utcnow(),
                     expires_at=expires_at)
    session.add(row)
    session.flush()
    return row


def get_file(session: Session, file_id: str, *, team_id: str) -> StoredFile:
    row = session.get(StoredFile, file_id)
    if row is None or row.team_id != team_id or _expired(row):
        raise NotFound(f"No such File object: {file_id}", param="id", code="not_found")
    return row


def _expired(row: StoredFile) -> bool:
    """Past its expires_at: gone for the API at once, before the purge removes it."""
    return row.expires_at is not None and row.expires_at <= utcnow()


def list_files(session: Session, query: PageQuery, *, team_id: str,
               purpose: str | None) -> Page[StoredFile]:
    where = [StoredFile.team_id == team_id,
             or_(StoredFile.expires_at.is_(None), StoredFile.expires_at > utcnow())]
    if purpose:
        where.append(StoredFile.purpose == purpose)
    return cursor_page(session, StoredFile, query, where)


def delete_file(settings: Settings, db: Database, file_id: str, *, team_id: str) -> None:
    """Forget the file, then remove its bytes (a reader that has it open finishes reading)."""
    with db.session() as session:
        session.delete(get_file(session, file_id, team_id=team_id))
    file_store(settings, db).delete(file_id)


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
        "expires_at": None if row.expires_at is None else int(row.expires_at.timestamp()),
        "status_details": None,
    }
