"""The stack of one run: its settings, its processes' environment, its batch teams."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import select

from app.cli.stack import free_port
from benchmarks.chaos.config import RunConfig
from benchmarks.chaos.faults import CRASH_AFTER_COMMIT_ENV
from benchmarks.chaos.services import OwnServices
from benchmarks.paths import ROOT
from domain.db import Database
from domain.models import Team
from domain.settings import Settings
from domain.team_secrets import secrets_in_force
from domain.teams import create_team, issue_key
from workers.sim.fleet_declaration import InstanceSpec
from workers.webhooks.signing import new_secret


def stack_settings(config: RunConfig, services: OwnServices, data_dir: Path) -> Settings:
    """Emulated engines in scaled time on the run's own services, short timers, JSON logs."""
    model_path = config.model_path or ROOT / ".blockq" / "models" / "tiny-llama"
    if not (model_path / "config.json").exists():
        raise SystemExit(f"tiny model missing at {model_path}: run scripts/setup.sh, or give "
                         "--model-path")
    return Settings(
        database_url=services.database_url, redis_url=services.redis_url, data_dir=data_dir,
        model_path=model_path, api_port=free_port(), flower_port=free_port(),
        webhook_secret=new_secret(), num_instances=config.instances,
        engine_kind="emulated", emulated_time_scale=config.time_scale,
        heartbeat_ttl_s=config.heartbeat_ttl_s, orphan_check_interval_s=1.0,
        # NOTE: a message a killed worker had taken stays unacknowledged until the sweep drops
        # it, once older than this, if its request has finished: 2 s (not 30) so that a kill
        # in the run's last seconds is cleaned before the leftover check's 6 s of samples end
        # (a CI run flagged such a message, taken seconds before the end).
        unacked_fresh_s=2.0,
        webhook_backoff_s=0.2, kv_cache_gib=0.5,
        sync_timeout_s=config.sync_timeout_s, batch_release_interval_s=0.2,
        max_batch_in_flight=64, log_format="json",
        webhook_allowed_networks="127.0.0.0/8",  # the run's receiver
        # Every client may hold a completion open: the run measures delivery, not the caps.
        held_connections_per_team=config.clients,
        **(_autoscaled(config) if config.autoscale else {}),
    )


def _autoscaled(config: RunConfig) -> dict[str, object]:
    """One autoscaled entry of the default model: `instances` at start, 1 to max_instances,
    a short cold start, quick decisions and a short surplus delay (so that the autoscaler's
    own scale events happen beside the forced ones)."""
    entry = InstanceSpec(model=Settings().model_name, engine="emulated",
                         count=config.instances, min_count=1,
                         max_count=max(config.max_instances, config.instances),
                         start_s=config.start_s)
    return {"fleet": (entry,), "autoscale": True,
            "autoscale_interval_s": config.autoscale_interval_s,
            "autoscale_window_s": 30.0,
            "autoscale_scale_down_after_s": config.scale_down_after_s}


def create_teams(settings: Settings, receiver_url: str) -> dict[str, tuple[str, str]]:
    """Two batch teams of different shares, with a batch webhook URL each;
    name -> (team id, key)."""
    db = Database(settings.resolved_database_url)
    keys = {}
    try:
        with db.session() as session:
            for name, share in (("chaos-a", 1), ("chaos-b", 2)):
                team = create_team(session, name, share=share, rate_limit_rpm=1_000_000,
                                   webhook_url=f"{receiver_url}/batches")
                keys[name] = (team.id, issue_key(session, team).key)
    finally:
        db.dispose()
    return keys


def signing_secrets(settings: Settings) -> list[str]:
    """The webhook signing secrets of every team (each team signs with its own)."""
    db = Database(settings.resolved_database_url)
    try:
        with db.session() as session:
            return [secret for team_id in session.scalars(select(Team.id))
                    for secret in secrets_in_force(session, team_id)]
    finally:
        db.dispose()


def stack_env(settings: Settings, config: RunConfig) -> dict[str, str]:
    """The stack processes' environment: ours without BLOCKQ_* variables, then the settings',
    the repository on PYTHONPATH, and the crash-after-commit fault point if armed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKQ_")}
    env.update(settings.as_env())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if config.crash_after_commit > 0:
        env[CRASH_AFTER_COMMIT_ENV] = str(config.crash_after_commit)
    return env
