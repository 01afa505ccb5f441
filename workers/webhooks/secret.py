"""Which secrets sign an event: its team's (domain/team_secrets.py), or, for a request that has no
team (rows from before teams existed), the global one from Settings or a file generated once in
data_dir."""

from __future__ import annotations

from sqlalchemy.orm import Session

from domain.local_secrets import configured_or_generated
from domain.settings import Settings
from domain.team_secrets import add_secret, secrets_in_force
from workers.webhooks.signing import new_secret

__all__ = ["webhook_secret", "signing_secrets"]


def webhook_secret(settings: Settings) -> str:
    """The global secret: signs only events of requests without a team."""
    return configured_or_generated(settings.webhook_secret, settings.data_dir / "webhook_secret",
                                   new_secret)


def signing_secrets(session: Session, settings: Settings, team_id: str | None) -> list[str]:
    """The secrets in force for the team's events, newest first. A team without one (created
    outside `create_team`) gets its own now, never the shared global one."""
    if team_id is None:
        return [webhook_secret(settings)]
    return secrets_in_force(session, team_id) or [add_secret(session, team_id)]
