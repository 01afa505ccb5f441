"""What a team may keep in the Files API and for how long: OpenAI's `expires_after` on an upload,
and the per-team storage quota (bytes of stored files).

The quota is checked in the transaction that records an upload, with the team's row locked, so
two concurrent uploads of one team cannot both pass it. Files blockq writes itself (batch output
and error files) count towards the quota but are never refused: they are the result of work the
team already paid for, and refusing them would lose it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from domain.errors import InvalidRequest, PermissionDenied
from domain.models import StoredFile, Team
from domain.settings import Settings

__all__ = ["expires_after_of_form", "expires_at_of", "StorageQuotaExceeded",
           "storage_used", "storage_limit", "check_quota", "MIN_EXPIRES_AFTER_S",
           "MAX_EXPIRES_AFTER_S"]

#: OpenAI's bounds on `expires_after.seconds`: one hour to 30 days.
MIN_EXPIRES_AFTER_S = 3600
MAX_EXPIRES_AFTER_S = 30 * 24 * 3600
ANCHORS = ("created_at",)


def expires_after_of_form(form: Mapping[str, str]) -> int | None:
    """`expires_after[anchor]` and `expires_after[seconds]` of a multipart upload (as the
    `openai` client sends `expires_after={"anchor": ..., "seconds": ...}`), checked: the
    seconds after the file's creation at which it expires, or None (it never does)."""
    anchor = form.get("expires_after[anchor]")
    seconds = form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor not in ANCHORS:
        raise InvalidRequest(f"Invalid 'expires_after[anchor]': {anchor!r}; the only supported "
                             "anchor is 'created_at'.", param="expires_after.anchor",
                             code="invalid_value")
    try:
        value = int(seconds or "")
    except ValueError:
        raise InvalidRequest("'expires_after[seconds]' must be an integer number of seconds "
                             f"from {MIN_EXPIRES_AFTER_S} to {MAX_EXPIRES_AFTER_S}.",
                             param="expires_after.seconds", code="invalid_value") from None
    if not MIN_EXPIRES_AFTER_S <= value <= MAX_EXPIRES_AFTER_S:
        raise InvalidRequest(f"'expires_after[seconds]' is {value}; it must be from "
                             f"{MIN_EXPIRES_AFTER_S} (one hour) to {MAX_EXPIRES_AFTER_S} "
                             "(30 days).", param="expires_after.seconds", code="invalid_value")
    return value


def expires_at_of(created_at: datetime, expires_after: int | None) -> datetime | None:
    return None if expires_after is None else created_at + timedelta(seconds=expires_after)


class StorageQuotaExceeded(PermissionDenied):
    """An upload would take the team's stored files past its storage quota."""

    def __init__(self, *, used: int, adding: int, limit: int) -> None:
        super().__init__(
            f"Storage quota exceeded: this team stores {used} bytes of files and may store "
            f"{limit}; this upload of {adding} bytes would take it past that. Delete files "
            "(DELETE /v1/files/{id}) or ask for a larger quota.",
            param="file", code="storage_quota_exceeded")
        self.used, self.adding, self.limit = used, adding, limit


def storage_used(session: Session, team_id: str) -> int:
    """Bytes of the team's stored files (uploads and batch outputs, expired or not: the bytes
    stay on disk until the purge removes them)."""
    return int(session.scalar(select(func.coalesce(func.sum(StoredFile.size_bytes), 0))
                              .where(StoredFile.team_id == team_id)) or 0)


def storage_limit(session: Session, settings: Settings, team_id: str, *,
                  lock: bool = False) -> int | None:
    """The team's quota in bytes (its own, else the configured default), None for no quota.
    `lock`: hold the team's row until the transaction ends (serialises its uploads)."""
    query = select(Team.storage_quota_bytes).where(Team.id == team_id)
    own = session.scalar(query.with_for_update() if lock else query)
    limit = own if own is not None else settings.storage_quota_bytes
    return limit or None


def check_quota(session: Session, settings: Settings, *, team_id: str, adding: int) -> None:
    """Raise StorageQuotaExceeded unless `adding` more bytes fit in the team's quota. Call it in
    the transaction that records the file: the team's row stays locked until it commits."""
    limit = storage_limit(session, settings, team_id, lock=True)
    if limit is None:
        return
    used = storage_used(session, team_id)
    if used + adding > limit:
        raise StorageQuotaExceeded(used=used, adding=adding, limit=limit)
