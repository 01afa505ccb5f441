"""`blockq models ...`: the model registry by hand (list, retrain, refit, roll back), and the
length model on files (length-train, length-predict, length-info), which needs no service."""

from __future__ import annotations

import json
import sys
from pathlib import Path

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


def _fail(message: str) -> None:
    """A one-line error and exit status 2 (bad input), no traceback."""
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


@models.command("length-train")
@click.option("--data", "data", type=click.Path(path_type=Path), required=True,
              help='TRAIN JSONL: {"prompt": text or chat messages, "model", "output_tokens"}.')
@click.option("--out", "out", type=click.Path(path_type=Path), required=True,
              help="Artifact to write (.npz; a readable .json summary is written beside it).")
@click.option("--source-name", default=None, help="Name of the rows' source (default: the file).")
@click.option("--licence", default=None, help="Licence of the rows, recorded in the artifact.")
@click.option("--encoder", type=click.Choice(["minilm", "static", "auto"]), default="minilm",
              help="minilm (default): the packaged MiniLM transformer, the accurate one (about "
                   "3.5 ms of CPU a prompt where the serving CPU has AMX, twice that or more "
                   "without); static: distilled token embeddings, no torch (about 1 ms, less "
                   "accurate), for serving on CPUs without AMX; auto: as this CPU would pick.")
def length_train(data: Path, out: Path, source_name: str | None, licence: str | None,
                 encoder: str) -> None:
    """Train the output-length model on your own rows (no service needed)."""
    from workers.predict.commands import train_file  # noqa: PLC0415
    from workers.predict.dataset import InputError  # noqa: PLC0415
    from workers.predict.length_model import make_encoder  # noqa: PLC0415

    try:
        head, metrics = train_file(data, out, source_name=source_name, licence=licence,
                                   encoder=make_encoder(encoder))
    except InputError as error:
        _fail(str(error))
    except ValueError as error:  # e.g. no row with an answer
        _fail(f"{data}: {error}")
    console.print(f"{head.name}: {metrics['num_rows']} rows, {metrics['num_prompts']} prompts, "
                  f"{metrics['num_models']} models; out-of-fold MAE "
                  f"{metrics['mae_tokens']:.1f} tokens ({metrics['num_folds']} folds by prompt)"
                  f"; wrote {out}")


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
              help="Default: BLOCKQ_LENGTH_MODEL_PATH, else this CPU's shipped artifact.")
def length_info(artifact: Path | None) -> None:
    """The length model's artifact: version, encoder, training sources and their licences."""
    from workers.predict.commands import artifact_summary  # noqa: PLC0415
    from workers.predict.length_model import bootstrap_artifact  # noqa: PLC0415

    path = artifact or Settings.load().length_model_path or bootstrap_artifact()
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
