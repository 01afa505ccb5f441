"""`blockq purge`: run the retention purge once, now (the health worker runs it on a schedule)."""

from __future__ import annotations

import click
from rich.console import Console

from domain.db import Database
from domain.retention import purge as run_purge
from domain.settings import Settings

__all__ = ["purge"]

console = Console()


@click.command()
def purge() -> None:
    """Delete what is older than its retention setting (BLOCKQ_RETAIN_*_DAYS) and files past
    their expires_at; safe while the stack runs, and beside another purge."""
    settings = Settings.load()
    db = Database(settings.resolved_database_url)
    try:
        report = run_purge(settings, db)
    finally:
        db.dispose()
    for name, count in report.items():
        console.print(f"{name}: {count} deleted")
