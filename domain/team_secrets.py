"""Per-team webhook signing secrets: one made with the team, rotated on demand.

Each team's events are signed with its own secret, so one team cannot forge another's. A
rotation returns the new secret once and keeps the previous one valid for a grace period, during
which events carry a signature made with each (Standard Webhooks: space-separated signatures),
so receivers can switch over without losing an event.
"""

from __future__ import annotations

import base64
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from domain.models import Team, TeamWebhookSecret, utcnow

__all__ = ["SECRET_PREFIX", "RotatedSecret", "new_secret", "add_secret", "rotate_secret",
           "secrets_in_force"]

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """A Standard Webhooks secret: `whsec_` + 32 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


@dataclass(frozen=True, slots=True)
class RotatedSecret:
    team_id: str
    secret: str  # shown once
    previous_valid_until: datetime | None  # None: the team had no secret before


def add_secret(session: Session, team_id: str) -> str:
    """A new current secret of the team (a new team's first)."""
    secret = new_secret()
    session.add(TeamWebhookSecret(id=f"whs_{uuid.uuid4().hex[:24]}", team_id=team_id,
                                  secret=secret))
    session.flush()
    return secret


def rotate_secret(session: Session, team: Team, *, grace: timedelta) -> RotatedSecret:
    """Make a new current secret; the current one stays valid for `grace`, secrets already
    expiring keep their (earlier) end, expired ones are deleted."""
    session.execute(select(Team.id).where(Team.id == team.id).with_for_update())  # one at a time
    now = utcnow()
    until = now + grace
    session.execute(delete(TeamWebhookSecret).where(TeamWebhookSecret.team_id == team.id,
                                                    TeamWebhookSecret.expires_at <= now))
    retired = session.execute(
        update(TeamWebhookSecret)
        .where(TeamWebhookSecret.team_id == team.id, TeamWebhookSecret.expires_at.is_(None))
        .values(expires_at=until)
    ).rowcount
    return RotatedSecret(team.id, add_secret(session, team.id), until if retired else None)


def secrets_in_force(session: Session, team_id: str, now: datetime | None = None) -> list[str]:
    """The secrets the team's events are signed with now, newest first."""
    now = now or utcnow()
    return list(session.scalars(
        select(TeamWebhookSecret.secret)
        .where(TeamWebhookSecret.team_id == team_id,
               or_(TeamWebhookSecret.expires_at.is_(None), TeamWebhookSecret.expires_at > now))
        .order_by(TeamWebhookSecret.created_at.desc(), TeamWebhookSecret.id)
    ))
