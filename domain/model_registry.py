"""The model registry (`model_versions`): register, promote, roll back, look up the active one.

At most one version per (kind, scope) is active. Callers own the transaction; every function
takes the session it runs in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from domain.models import ModelStatus, ModelVersion, utcnow

__all__ = ["KIND_LENGTH", "KIND_EXEC", "active", "active_id", "register", "promote", "rollback",
           "versions"]

KIND_LENGTH = "length"
KIND_EXEC = "exec"


def active(session: Session, kind: str, scope: str) -> ModelVersion | None:
    return session.scalar(
        select(ModelVersion).where(ModelVersion.kind == kind, ModelVersion.scope == scope,
                                   ModelVersion.status == ModelStatus.ACTIVE)
    )


def active_id(session: Session, kind: str, scope: str) -> int | None:
    """The active version's row id without loading its artifact (what reloaders poll)."""
    return session.scalar(
        select(ModelVersion.id).where(ModelVersion.kind == kind, ModelVersion.scope == scope,
                                      ModelVersion.status == ModelStatus.ACTIVE)
    )


def versions(session: Session, kind: str | None = None, scope: str | None = None
             ) -> list[ModelVersion]:
    query = select(ModelVersion).order_by(ModelVersion.kind, ModelVersion.scope,
                                          ModelVersion.version)
    if kind is not None:
        query = query.where(ModelVersion.kind == kind)
    if scope is not None:
        query = query.where(ModelVersion.scope == scope)
    return list(session.scalars(query))


def register(session: Session, *, kind: str, scope: str, artifact: bytes, training_rows: int,
             metrics: Mapping[str, Any], note: str | None = None) -> ModelVersion:
    """Add a candidate with the next version number of its (kind, scope)."""
    # NOTE: two concurrent registrations would pick the same number; the unique constraint on
    # (kind, scope, version) makes the second fail rather than duplicate.
    latest = session.scalar(
        select(func.max(ModelVersion.version))
        .where(ModelVersion.kind == kind, ModelVersion.scope == scope)
    )
    row = ModelVersion(kind=kind, scope=scope, version=(latest or 0) + 1,
                       status=ModelStatus.CANDIDATE, training_rows=training_rows,
                       metrics=dict(metrics), artifact=artifact, note=note)
    session.add(row)
    session.flush()
    return row


def promote(session: Session, row: ModelVersion) -> None:
    """Make `row` the active version of its (kind, scope); the previous one is retired."""
    session.execute(
        update(ModelVersion)
        .where(ModelVersion.kind == row.kind, ModelVersion.scope == row.scope,
               ModelVersion.status == ModelStatus.ACTIVE, ModelVersion.id != row.id)
        .values(status=ModelStatus.RETIRED)
        .execution_options(synchronize_session=False)
    )
    row.status = ModelStatus.ACTIVE
    row.promoted_at = utcnow()
    session.flush()


def rollback(session: Session, kind: str, scope: str) -> ModelVersion | None:
    """Retire the active version and reactivate the one promoted before it.

    Returns the version now active, or None when none was promoted before (the packaged or
    configured default is then in use again).
    """
    current = active(session, kind, scope)
    if current is None:
        raise LookupError(f"no active {kind} model for {scope!r} to roll back")
    current.status = ModelStatus.RETIRED
    current.note = "rolled back"
    previous = session.scalar(
        select(ModelVersion)
        .where(ModelVersion.kind == kind, ModelVersion.scope == scope,
               ModelVersion.status == ModelStatus.RETIRED,
               ModelVersion.promoted_at.is_not(None), ModelVersion.id != current.id,
               ModelVersion.promoted_at <= current.promoted_at)
        .order_by(ModelVersion.promoted_at.desc(), ModelVersion.id.desc())
        .limit(1)
    )
    session.flush()
    if previous is not None:
        previous.status = ModelStatus.ACTIVE
        session.flush()
    return previous
