"""Teams and their API keys: create a team, issue and revoke keys, resolve a presented key.

Keys are random (`bq-` + 43 URL-safe characters, 256 bits); only their SHA-256 is stored, so a
database leak does not leak usable keys, and a fast hash is enough for keys this long.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from domain.errors import Conflict, NotFound
from domain.models import ApiKey, Team, utcnow
from domain.team_secrets import add_secret

__all__ = ["Principal", "IssuedKey", "create_team", "issue_key", "revoke_key", "principal_of",
           "principal_of_digest", "key_digest", "team_by_name", "ensure_team_key"]

KEY_PREFIX = "bq-"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the team of the presented key."""

    team_id: str
    team_name: str
    key_id: str
    is_admin: bool
    rate_limit_rpm: int | None
    share: int
    # What happens to its requests whose latency targets no instance can meet (domain/slo.py).
    slo_miss_action: str = "route"


@dataclass(frozen=True, slots=True)
class IssuedKey:
    key_id: str
    team_id: str
    key: str  # the secret: shown once, never stored


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_team(session: Session, name: str, *, share: int = 1, rate_limit_rpm: int | None = None,
                webhook_url: str | None = None, storage_quota_bytes: int | None = None,
                slo_miss_action: str = "route") -> Team:
    """A new team with its own webhook signing secret (domain/team_secrets.py)."""
    team = Team(id=f"team_{uuid.uuid4().hex[:24]}", name=name, share=share,
                rate_limit_rpm=rate_limit_rpm, webhook_url=webhook_url,
                storage_quota_bytes=storage_quota_bytes, slo_miss_action=slo_miss_action)
    session.add(team)
    try:
        session.flush()
    except IntegrityError:
        raise Conflict(f"A team named '{name}' already exists.", param="name",
                       code="team_exists") from None
    add_secret(session, team.id)
    return team


def ensure_team_key(session: Session, team_name: str, *, is_admin: bool = False,
                    rate_limit_rpm: int | None = None) -> IssuedKey:
    """A new key for the named team, creating the team first if needed (local stack, demo)."""
    team = session.scalar(select(Team).where(Team.name == team_name))
    if team is None:
        team = create_team(session, team_name, rate_limit_rpm=rate_limit_rpm)
    return issue_key(session, team, name="local", is_admin=is_admin)


def team_by_name(session: Session, name: str) -> Team:
    team = session.scalar(select(Team).where(Team.name == name))
    if team is None:
        raise NotFound(f"No team named '{name}'.", param="team", code="team_not_found")
    return team


def issue_key(session: Session, team: Team, *, name: str = "default",
              is_admin: bool = False) -> IssuedKey:
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    row = ApiKey(id=f"key_{uuid.uuid4().hex[:24]}", team_id=team.id, name=name,
                 key_sha256=key_digest(key), key_prefix=key[:10], is_admin=is_admin)
    session.add(row)
    session.flush()
    return IssuedKey(key_id=row.id, team_id=team.id, key=key)


def revoke_key(session: Session, key_id: str) -> ApiKey:
    """Revoke a key (idempotent); it stops working at once."""
    row = session.get(ApiKey, key_id)
    if row is None:
        raise NotFound(f"No API key with id '{key_id}'.", param="key_id", code="key_not_found")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
    return row


# NOTE: the columns a principal needs, not the two entities; built once (every call passes
# here): only the digest is bound per call.
_PRINCIPAL = (
    select(Team.id, Team.name, ApiKey.id, ApiKey.is_admin, Team.rate_limit_rpm, Team.share,
           Team.slo_miss_action)
    .select_from(ApiKey).join(Team, Team.id == ApiKey.team_id)
    .where(ApiKey.key_sha256 == bindparam("digest"), ApiKey.revoked_at.is_(None))
)


def principal_of(session: Session | Connection, key: str) -> Principal | None:
    """The principal of a presented key, or None if the key is unknown or revoked (one
    SELECT: an ORM session or a Core connection)."""
    return principal_of_digest(session, key_digest(key))


def principal_of_digest(session: Session | Connection, digest: str) -> Principal | None:
    """`principal_of` the key whose digest (`key_digest`) is given."""
    found = session.execute(_PRINCIPAL, {"digest": digest}).first()
    if found is None:
        return None
    team_id, team_name, key_id, is_admin, rate_limit_rpm, share, slo_miss_action = found
    return Principal(team_id=team_id, team_name=team_name, key_id=key_id, is_admin=is_admin,
                     rate_limit_rpm=rate_limit_rpm, share=share, slo_miss_action=slo_miss_action)
