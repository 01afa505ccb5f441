"""`blockq models ...`: the model registry by hand (list, retrain, refit, roll back), and the
length model on files (length-train, length-predict, length-info), which needs no service."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from domain import model_registry as registry
from domain.settings import Settings

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


def _fail(message: str) -> None:
    """A one-line error and exit status 2 (bad input), no traceback."""
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


@models.command("length-train")
@click.option("--data", "data", type=click.Path(path_type=Path), required=True,
              help='TRAIN JSONL: {"prompt": text or chat messages, "model", "output_tokens"}.')
@click.option("--out", "out", type=click.Path(path_type=Path), required=True,
              help="Artifact to write (.npz; a readable .json summary is written beside it). "
                   "With --encoder both, the fast head goes beside it as <stem>_static.npz.")
@click.option("--source-name", default=None, help="Name of the rows' source (default: the file).")
@click.option("--licence", default=None, help="Licence of the rows, recorded in the artifact.")
@click.option("--encoder", type=click.Choice(["both", "minilm", "static", "auto"]),
              default="both",
              help="both (default): the two heads serving uses, from the same rows: the "
                   "accurate one on the packaged MiniLM transformer (bulk work, batched) to "
                   "--out, the fast one on distilled static embeddings (the hot path, no torch) "
                   "beside it; minilm or static: that head alone; auto: the one this CPU would "
                   "run one prompt at a time (MiniLM where it has AMX).")
def length_train(data: Path, out: Path, source_name: str | None, licence: str | None,
                 encoder: str) -> None:
    """Train the output-length model on your own rows (no service needed)."""
    from workers.predict.commands import train_heads  # noqa: PLC0415
    from workers.predict.dataset import InputError  # noqa: PLC0415

    try:
        written = train_heads(data, out, encoder=encoder, source_name=source_name,
                              licence=licence)
    except InputError as error:
        _fail(str(error))
    except ValueError as error:  # e.g. no row with an answer
        _fail(f"{data}: {error}")
    for path, head, metrics in written:
        console.print(f"{head.name} ({head.encoder.get('name')}): {metrics['num_rows']} rows, "
                      f"{metrics['num_prompts']} prompts, {metrics['num_models']} models; "
                      f"out-of-fold MAE {metrics['mae_tokens']:.1f} tokens "
                      f"({metrics['num_folds']} folds by prompt); wrote {path}")


@models.command("length-predict")
@click.option("--artifact", type=click.Path(path_type=Path), required=True,
              help="A length-model artifact (from length-train, or the shipped one).")
@click.option("--data", "data", type=click.Path(path_type=Path), required=True,
              help='TEST JSONL: {"prompt", "model"[, "max_tokens"]} per line.')
def length_predict(artifact: Path, data: Path) -> None:
    """Print {"predicted_tokens": n} per TEST line, in order (unknown models: zero-shot)."""
    from workers.predict.commands import predict_file  # noqa: PLC0415
    from workers.predict.dataset import InputError  # noqa: PLC0415

    if not artifact.is_file():
        _fail(f"{artifact}: no such artifact")
    try:
        lines = [json.dumps(p) for p in predict_file(artifact, data)]
    except InputError as error:
        _fail(str(error))
    except (ValueError, KeyError, OSError) as error:
        _fail(f"{artifact}: not a length-model artifact ({error})")
    sys.stdout.write("\n".join(lines) + "\n")


@models.command("length-info")
@click.option("--artifact", type=click.Path(path_type=Path), default=None,
              help="One artifact's details. Default: the accurate head as configured "
                   "(BLOCKQ_LENGTH_MODEL_PATH, else the shipped MiniLM head), after the table "
                   "of which path uses which head.")
@click.option("--cost/--no-cost", default=True,
              help="Measure each path's CPU cost a prompt on this machine (default on).")
def length_info(artifact: Path | None, cost: bool) -> None:
    """Which path uses which length head and what each costs; an artifact's version, encoder,
    training sources and their licences."""
    from workers.predict.commands import artifact_summary  # noqa: PLC0415
    from workers.predict.length_model import head_artifact  # noqa: PLC0415

    settings = Settings.load()
    if artifact is None:
        _print_path_heads(settings, measure=cost)
    path = artifact or head_artifact("accurate", accurate=settings.length_model_path)
    try:
        summary = artifact_summary(path)
    except (ValueError, KeyError, OSError) as error:
        _fail(f"{path}: not a length-model artifact ({error})")
    table = Table(title=f"length model {summary['version']} ({summary['artifact']})")
    table.add_column("training source")
    table.add_column("licence")
    table.add_column("rows", justify="right")
    for source in summary["sources"] or [{"name": "not recorded", "licence": "unknown"}]:
        table.add_row(str(source.get("name")), str(source.get("licence")),
                      str(source.get("rows", "-")))
    console.print(table)
    console.print(f"encoder {summary['encoder']}; {summary['serving_models']} serving models "
                  f"known; trained {summary['trained_at']} on {summary['rows']} rows "
                  f"({summary['prompts']} prompts), method {summary['method']}")


def _print_path_heads(settings: Settings, *, measure: bool) -> None:
    from workers.predict.commands import path_heads  # noqa: PLC0415

    try:
        heads = path_heads(accurate=settings.length_model_path,
                           fast=settings.length_fast_model_path, measure=measure)
    except (ValueError, KeyError, OSError) as error:
        _fail(f"a configured length head cannot load ({error})")
    # NOTE: lines, not a table: a narrow terminal would cut the artifacts' paths.
    for head in heads:
        cost = "" if head.cost_ms is None else f"; {head.cost_ms:.1f} ms of CPU a prompt"
        console.print(f"{head.path} head: {head.artifact} (encoder {head.encoder}{cost})\n"
                      f"  used by {head.used_by}", markup=False, soft_wrap=True)
    if measure:
        console.print("costs: this process's CPU on this machine now (fast: one prompt a call, "
                      "accurate: 32 prompts a call), after a warm-up call; a timing, not a "
                      "figure to quote", soft_wrap=True)
