"""`blockq models ...`: the model registry by hand (list, retrain, refit, roll back)."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from app import model_registry as registry
from app.settings import Settings

__all__ = ["models"]

console = Console()


def _runtime():  # type: ignore[no-untyped-def]
    from workers import runtime  # noqa: PLC0415 - worker code loads only for these commands

    return runtime.configure(Settings.load())


def _print_report(report) -> None:  # type: ignore[no-untyped-def]
    version = f" version {report.version}" if report.version is not None else ""
    console.print(f"[bold]{report.kind}[/bold] {report.scope}: {report.outcome}{version} "
                  f"({report.reason}; {report.training_rows} training rows, "
                  f"{report.holdout_rows} held out)")


@click.group()
def models() -> None:
    """The model registry: length models and execution-time models."""


@models.command("list")
@click.option("--kind", type=click.Choice(["length", "exec"]), default=None)
def list_versions(kind: str | None) -> None:
    """Every registered version with its status and held-out metrics."""
    rt = _runtime()
    table = Table()
    for column in ("kind", "scope", "version", "status", "training rows", "held-out candidate",
                   "held-out active then", "created"):
        table.add_column(column)
    with rt.db.session() as session:
        for row in registry.versions(session, kind):
            metric = "mae_tokens" if row.kind == registry.KIND_LENGTH else "mape"
            table.add_row(row.kind, row.scope, str(row.version), row.status,
                          str(row.training_rows), _metric(row.metrics, "candidate", metric),
                          _metric(row.metrics, "active", metric),
                          row.created_at.strftime("%Y-%m-%d %H:%M:%S"))
    console.print(table)


def _metric(metrics: dict, which: str, name: str) -> str:  # type: ignore[type-arg]
    value = metrics.get(which, {}).get(name)
    return "-" if value is None else f"{name} {value:.4g}"


@models.command()
def retrain() -> None:
    """Retrain the served model's length model from history; promote it if it is better."""
    from workers.learn.tasks import run_retrain  # noqa: PLC0415

    _print_report(run_retrain(_runtime()))


@models.command()
@click.option("--instance", "instance_ids", multiple=True,
              help="Instance id (repeatable); default every registered instance.")
def refit(instance_ids: tuple[str, ...]) -> None:
    """Refit execution-time models from recorded engine steps; promote the better ones."""
    from workers.learn.tasks import run_refit  # noqa: PLC0415

    for report in run_refit(_runtime(), list(instance_ids) or None):
        _print_report(report)


@models.command()
@click.option("--kind", type=click.Choice(["length", "exec"]), required=True)
@click.option("--scope", default=None,
              help="Served model name (length; default the configured one) or instance id.")
def rollback(kind: str, scope: str | None) -> None:
    """Retire the active version and bring back the one promoted before it."""
    rt = _runtime()
    if scope is None:
        if kind == registry.KIND_EXEC:
            raise click.UsageError("--scope (the instance id) is required with --kind exec")
        scope = rt.settings.model_name
    with rt.db.session() as session:
        try:
            previous = registry.rollback(session, kind, scope)
        except LookupError as exc:
            raise click.ClickException(str(exc)) from None
        now = f"version {previous.version}" if previous else "the packaged/configured default"
    if kind == registry.KIND_LENGTH:
        rt.bias_watch.reset(scope)
    console.print(f"{kind} model of {scope} rolled back: {now} is active; workers reload it "
                  f"within {rt.settings.model_reload_interval_s:g} s")
