"""The `blockq` command: run the local stack, the sample job, and the migrations."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

import click
from pydantic import ValidationError
from rich.console import Console

from app.cli.admin import keys, teams
from app.cli.autoscaler import StackAutoscaler
from app.cli.client import batch, submit
from app.cli.demo import JobSummary, load_sample_prompts, run_sample_job, summarize
from app.cli.models import models
from app.cli.plan import plan
from app.cli.retention import purge
from app.cli.showcase import print_showcase, run_showcase
from app.cli.stack import ENGINE_STOP_GRACE_S, Stack, StackError
from app.cli.stack_lock import stop_stack
from domain.logs import configure as configure_logs
from domain.migrate import upgrade
from domain.private_paths import private_dir
from domain.settings import Settings, describe_invalid

__all__ = ["main"]

console = Console()


def _prepare(settings: Settings) -> dict[str, str]:
    """Check the model, apply migrations, and return the children's environment.

    Also sends this process's log records (the supervisor's deaths and restarts) to the console.
    """
    configure_logs(settings, role="supervisor")
    model = settings.resolved_model_path
    for path in {model, *(spec.model_path for spec in settings.instances)}:
        if path is not None and not (path / "config.json").exists():
            raise click.ClickException(
                f"no model at {path}: build the tiny test models with `python "
                f"scripts/build_tiny_model.py --out {path}` (add `--arch qwen2` for tiny-qwen), "
                "or set BLOCKQ_MODEL_PATH (BLOCKQ_FLEET's model_path)"
            )
    private_dir(settings.data_dir)  # the SQLite database, logs, secrets, files: 0700
    upgrade(settings.resolved_database_url)
    return {**os.environ, **settings.as_env(), "BLOCKQ_MODEL_PATH": str(model.resolve())}


class _Commands(click.Group):
    """The command group; invalid settings end a command with a message, not a traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except ValidationError as invalid:
            raise click.ClickException(describe_invalid(invalid)) from None


@click.group(cls=_Commands)
def main() -> None:
    """blockq: predictive routing of LLM requests over Celery."""


@main.command()
@click.option(
    "--requests",
    "num_requests",
    default=240,
    show_default=True,
    help="How many sample prompts to send (the shipped file has 300).",
)
@click.option("--showcase/--no-showcase", default=True, show_default=True,
              help="After the sample job, the routing showcase on an emulated mixed fleet.")
def demo(num_requests: int, showcase: bool) -> None:
    """Start the local stack, run the sample job through the API, print a summary, shut down;
    then the routing showcase (round_robin, least_requests and block_slo side by side on an
    emulated fleet of fast and slow GPUs)."""
    logging.getLogger("alembic").setLevel(logging.WARNING)  # a fresh database's migrations
    settings = Settings.load()
    _sample_job(settings, num_requests)
    if showcase:
        console.rule("Routing showcase")
        try:
            print_showcase(run_showcase(settings, _prepare, console), console)
        except StackError as exc:
            raise click.ClickException(str(exc)) from None
    _where_to_look(settings)
    console.print("done")


def _sample_job(settings: Settings, num_requests: int) -> None:
    """The sample job on the real vLLM engines (the tiny test model)."""
    stack = Stack(settings, env=_prepare(settings))
    console.print(
        f"starting the local stack ({len(settings.initial_instance_ids)} engine workers, "
        f"database {'PostgreSQL' if settings.database_url else 'embedded SQLite'})"
    )
    try:
        stack.start()
        stack.supervise()
        stack.wait_ready(num_instances=len(settings.initial_instance_ids))
        key = stack.issue_api_key("demo")
        console.print(f"stack ready at {stack.api_url}; API key of team 'demo': {key}")
        console.print(f"sending {num_requests} requests")
        started = time.monotonic()
        models = list(dict.fromkeys(spec.model for spec in settings.instances))
        console.print(f"models served: {', '.join(models)} (the prompts alternate among them)")
        results = run_sample_job(stack.client(key), load_sample_prompts(num_requests),
                                 models=models)
        summarize(JobSummary.of(results, time.monotonic() - started), console)
    except StackError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        console.print("shutting down")
        stack.stop()


def _where_to_look(settings: Settings) -> None:
    """Where an operator looks next, once `blockq serve` keeps the stack up."""
    metrics = " (Authorization: Bearer $BLOCKQ_METRICS_TOKEN)" if settings.metrics_token else ""
    auth = ("BLOCKQ_FLOWER_BASIC_AUTH" if settings.flower_basic_auth else
            f"user:password in {settings.data_dir / 'flower_basic_auth'}")
    api = f"http://{settings.api_host}:{settings.api_port}"
    console.rule("Where to look next")
    console.print(
        "`blockq serve` (or `make serve`) keeps the stack up; then:\n"
        f"  Flower (Celery workers and queues; gpu.<k> are the engines): "
        f"http://{settings.api_host}:{settings.flower_port}  basic auth: {auth}\n"
        f"  Prometheus metrics of every process: {api}/metrics{metrics}\n"
        f"  the API reference: {api}/docs\n"
        "  benchmarks: docs/benchmarks_live.md (routing, live), docs/benchmarks_cluster.md "
        "(routing, simulated), docs/benchmarks_length.md (the length model), "
        "docs/benchmarks.md (all)")


@main.command()
def serve() -> None:
    """Serve the local stack until interrupted (Ctrl-C); a process that dies is restarted."""
    settings = Settings.load()
    stack = Stack(settings)
    try:  # before anything else: refused at once while another stack runs on this data dir
        stack.hold_data_dir()
    except StackError as exc:
        raise click.ClickException(str(exc)) from None
    stack.env = _prepare(settings)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    autoscaler: StackAutoscaler | None = None
    try:
        stack.start()
        stack.supervise()
        stack.wait_ready(num_instances=len(settings.initial_instance_ids))
        if settings.autoscale:
            autoscaler = StackAutoscaler(stack, settings)
            autoscaler.start()
            console.print(f"autoscaling every {settings.autoscale_interval_s:g} s over "
                          f"{len(settings.instance_ids)} instance slots")
        console.print(f"blockq serving at {stack.api_url} (logs in {stack.log_dir}); Ctrl-C stops")
        console.print("API keys: `blockq teams create NAME` makes a team and prints its key")
        console.print(f"Flower at {stack.flower_url} (basic auth: BLOCKQ_FLOWER_BASIC_AUTH, or "
                      f"the generated {settings.data_dir / 'flower_basic_auth'})")
        while True:
            stack.check_alive()
            time.sleep(1)
    except StackError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        pass
    finally:
        console.print("shutting down")
        if autoscaler is not None:
            autoscaler.stop()
        stack.stop()


@main.command()
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0), show_default=True,
              default=ENGINE_STOP_GRACE_S + 60,
              help="Seconds the processes get to shut down softly before they are SIGKILLed.")
def stop(timeout_s: float) -> None:
    """Stop the stack that `blockq serve` runs on this data directory, orphans included."""
    settings = Settings.load()
    found, killed = stop_stack(settings.data_dir, timeout_s)
    if not found:
        console.print(f"no blockq stack runs on {settings.data_dir}")
        return
    console.print(f"stopped: {', '.join(map(str, found))}")
    if killed:
        console.print(f"SIGKILLed after {timeout_s:.0f} s: {', '.join(map(str, killed))}")


@main.command()
def autoscale() -> None:
    """Decide every BLOCKQ_AUTOSCALE_INTERVAL_S and publish blockq_desired_instances, starting
    nothing: for an orchestrator that scales the engines on it (KEDA, docs/deploy.md)."""
    settings = Settings.load()
    if not settings.autoscale:
        raise click.ClickException("BLOCKQ_AUTOSCALE is not true: nothing to decide")
    autoscaler = StackAutoscaler(None, settings)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    console.print(f"autoscaling {len(settings.instance_ids)} instance slots every "
                  f"{settings.autoscale_interval_s:g} s (deciding only)")
    try:
        autoscaler.run()
    except KeyboardInterrupt:
        pass
    finally:
        autoscaler.stop()


@main.command()
def migrate() -> None:
    """Apply database migrations up to the latest revision."""
    settings = Settings.load()
    upgrade(settings.resolved_database_url)
    console.print("database at the latest revision")


@main.command("settings")
def show_settings() -> None:
    """List every setting, its environment variable, default and meaning."""
    for name, info in Settings.model_fields.items():
        env = Settings.env_name(name)
        console.print(f"[bold]{env}[/bold] (default {info.default!r})\n    {info.description}")


for group in (models, teams, keys, submit, batch, purge, plan):
    main.add_command(group)
