"""`blockq teams ...` and `blockq keys ...`: tenant administration, straight on the database."""

from __future__ import annotations

from datetime import timedelta

import click
from rich.console import Console
from rich.table import Table
from sqlalchemy import select

from domain.db import Database
from domain.errors import BlockqError
from domain.models import ApiKey, Team
from domain.settings import Settings
from domain.slo import SloMissAction
from domain.team_secrets import rotate_secret, secrets_in_force
from domain.teams import create_team, issue_key, revoke_key, team_by_name
from domain.webhook_targets import check_submitted_url

__all__ = ["teams", "keys"]

console = Console()

_SLO_MISS_ACTION_HELP = ("What happens to the team's requests whose latency targets no "
                         "instance can meet: route them anyway, queue them as batch work, or "
                         "refuse them (429 with Retry-After).")


def _database() -> Database:
    return Database(Settings.load().resolved_database_url)


@click.group()
def teams() -> None:
    """Teams: who owns requests, files, batches and API keys."""


@teams.command("create")
@click.argument("name")
@click.option("--share", default=1, show_default=True, type=click.IntRange(min=1),
              help="Weight of the team's batch work against other teams'.")
@click.option("--rate-limit", "rate_limit_rpm", type=click.IntRange(min=1), default=None,
              help="Requests per minute (default: BLOCKQ_RATE_LIMIT_RPM).")
@click.option("--webhook-url", default=None, help="Where the team's batch events are sent.")
@click.option("--storage-quota", "storage_quota_bytes", type=click.IntRange(min=1), default=None,
              help="Bytes of stored files (default: BLOCKQ_STORAGE_QUOTA_BYTES).")
@click.option("--slo-miss-action", type=click.Choice([str(a) for a in SloMissAction]),
              default=str(SloMissAction.ROUTE), show_default=True,
              help=_SLO_MISS_ACTION_HELP)
@click.option("--with-key/--no-key", default=True, show_default=True,
              help="Also issue a first API key and print it.")
def create_team_command(name: str, share: int, rate_limit_rpm: int | None,
                        webhook_url: str | None, with_key: bool,
                        storage_quota_bytes: int | None, slo_miss_action: str) -> None:
    """Create a team (and its first API key); prints its webhook signing secret once."""
    db = _database()
    try:
        check_submitted_url(webhook_url, Settings.load().webhook_allowed_networks)
        with db.session() as session:
            team = create_team(session, name, share=share, rate_limit_rpm=rate_limit_rpm,
                               webhook_url=webhook_url, storage_quota_bytes=storage_quota_bytes,
                               slo_miss_action=slo_miss_action)
            issued = issue_key(session, team) if with_key else None
            secret = secrets_in_force(session, team.id)[0]
    except BlockqError as exc:
        raise click.ClickException(exc.message) from None
    finally:
        db.dispose()
    console.print(f"team {name} created: {team.id}")
    _print_webhook_secret(secret)
    if issued:
        _print_key(issued.key_id, issued.key)


@teams.command("set")
@click.argument("name")
@click.option("--slo-miss-action", type=click.Choice([str(a) for a in SloMissAction]),
              required=True, help=_SLO_MISS_ACTION_HELP)
def set_team(name: str, slo_miss_action: str) -> None:
    """Change a team's settings (requests already accepted keep theirs)."""
    db = _database()
    try:
        with db.session() as session:
            team_by_name(session, name).slo_miss_action = slo_miss_action
    except BlockqError as exc:
        raise click.ClickException(exc.message) from None
    finally:
        db.dispose()
    console.print(f"team {name}: slo_miss_action {slo_miss_action}")


@teams.command("rotate-webhook-secret")
@click.argument("name")
@click.option("--grace-s", type=click.FloatRange(min=0), default=None,
              help="Seconds the current secret still signs events (default: "
              "BLOCKQ_WEBHOOK_SECRET_GRACE_S, 24 h).")
def rotate_webhook_secret(name: str, grace_s: float | None) -> None:
    """A new webhook signing secret for the team, printed once; the current one stays valid
    for the grace period (events carry both signatures meanwhile)."""
    settings = Settings.load()
    grace = timedelta(seconds=settings.webhook_secret_grace_s if grace_s is None else grace_s)
    db = Database(settings.resolved_database_url)
    try:
        with db.session() as session:
            rotated = rotate_secret(session, team_by_name(session, name), grace=grace)
    except BlockqError as exc:
        raise click.ClickException(exc.message) from None
    finally:
        db.dispose()
    if rotated.previous_valid_until:
        until = rotated.previous_valid_until
        console.print(f"the previous secret stays valid until {until:%Y-%m-%d %H:%M:%S} UTC")
    _print_webhook_secret(rotated.secret)


@teams.command("list")
def list_teams() -> None:
    """Every team with its share, rate limit and number of active keys."""
    db = _database()
    table = Table()
    for column in ("id", "name", "share", "rate limit (rpm)", "slo miss", "active keys",
                   "webhook"):
        table.add_column(column)
    with db.session() as session:
        for team in session.scalars(select(Team).order_by(Team.name)):
            active = session.scalars(select(ApiKey.id).where(
                ApiKey.team_id == team.id, ApiKey.revoked_at.is_(None))).all()
            table.add_row(team.id, team.name, str(team.share),
                          str(team.rate_limit_rpm or "default"), team.slo_miss_action,
                          str(len(active)),
                          team.webhook_url or "-")
    db.dispose()
    console.print(table)


@click.group()
def keys() -> None:
    """API keys: issue, list, revoke."""


@keys.command("create")
@click.option("--team", "team_name", required=True, help="Name of the team.")
@click.option("--name", default="default", show_default=True, help="A label for the key.")
@click.option("--admin", is_flag=True, help="An admin key (operations endpoints).")
def create_key(team_name: str, name: str, admin: bool) -> None:
    """Issue a key; it is printed once and stored only as a hash."""
    db = _database()
    try:
        with db.session() as session:
            issued = issue_key(session, team_by_name(session, team_name), name=name,
                               is_admin=admin)
    except BlockqError as exc:
        raise click.ClickException(exc.message) from None
    finally:
        db.dispose()
    _print_key(issued.key_id, issued.key)


@keys.command("list")
@click.option("--team", "team_name", default=None, help="Only this team's keys.")
def list_keys(team_name: str | None) -> None:
    """Keys with their prefix, team and state (the keys themselves are not stored)."""
    db = _database()
    table = Table()
    for column in ("id", "team", "name", "prefix", "admin", "created", "revoked"):
        table.add_column(column)
    with db.session() as session:
        query = select(ApiKey, Team.name).join(Team).order_by(Team.name, ApiKey.created_at)
        if team_name:
            query = query.where(Team.name == team_name)
        for key, team in session.execute(query):
            table.add_row(key.id, team, key.name, key.key_prefix + "...", "yes" if key.is_admin
                          else "", f"{key.created_at:%Y-%m-%d %H:%M}",
                          f"{key.revoked_at:%Y-%m-%d %H:%M}" if key.revoked_at else "")
    db.dispose()
    console.print(table)


@keys.command("revoke")
@click.argument("key_id")
def revoke(key_id: str) -> None:
    """Revoke a key: it stops working on the next request."""
    db = _database()
    try:
        with db.session() as session:
            revoke_key(session, key_id)
    except BlockqError as exc:
        raise click.ClickException(exc.message) from None
    finally:
        db.dispose()
    console.print(f"key {key_id} revoked")


def _print_webhook_secret(secret: str) -> None:
    console.print("webhook signing secret (shown once; store it now):")
    click.echo(secret)


def _print_key(key_id: str, key: str) -> None:
    console.print(f"API key {key_id} (shown once; store it now):")
    click.echo(key)
