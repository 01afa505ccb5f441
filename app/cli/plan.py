"""`blockq plan`: the cheapest fleet of GPU kinds for a workload and its latency targets, each
candidate judged by the cluster simulation that runs blockq's routing decision (workers/plan).

The workload comes from a JSONL file (`--workload`) or from the request history in the database
(`--from-history HOURS`: the finished requests of the last HOURS hours, `request_outcomes`, each
arriving its end-to-end latency before it finished). Every input is checked before the search
starts, and a bad one ends the command with a message naming the line, model or kind; the JSON
and the fleet are written only once the plan is complete, each in one rename.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from domain.db import Database
from domain.models import RequestOutcome
from domain.settings import Settings
from domain.slo import SloTargets
from workers.plan import (
    DEFAULT_CATALOG,
    Catalog,
    FleetPlan,
    PlanInputError,
    PlanOptions,
    PlanRequest,
    PlanWorkload,
    Targets,
    derived_models,
    fleet_entries,
    load_catalog,
    parse_workload,
    plan_fleet,
    plan_json,
    workload_of,
)

__all__ = ["history_workload", "parse_model_map", "parse_slo", "plan"]

console = Console()
#: The keys of a --slo target and the SloTargets fields they are checked as.
_SLO_KEYS = {"ttft_p99": "ttft_ms", "e2e_p99": "e2e_ms"}


def parse_slo(text: str) -> tuple[str, Targets]:
    """``MODEL:ttft_p99=S[,e2e_p99=S]`` (seconds) as a model's targets; the bounds and rules are
    the per-request targets' (domain/slo.py: 1 ms to an hour, e2e not below ttft)."""
    model, colon, rest = text.rpartition(":")
    if not colon or not model or not rest:
        raise click.BadParameter(f"{text!r}: expected MODEL:ttft_p99=S[,e2e_p99=S]")
    seconds: dict[str, float] = {}
    for part in rest.split(","):
        key, equals, value = part.partition("=")
        if key.strip() not in _SLO_KEYS or not equals:
            raise click.BadParameter(f"model {model!r}: {part!r}: expected ttft_p99=S or "
                                     "e2e_p99=S (seconds)")
        try:
            seconds[key.strip()] = float(value)
        except ValueError:
            raise click.BadParameter(f"model {model!r}: {key.strip()}: {value!r} is not a "
                                     "number of seconds") from None
    try:
        SloTargets.model_validate({_SLO_KEYS[k]: v * 1000 for k, v in seconds.items()})
    except ValidationError as exc:
        message = exc.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")
        for key, field in _SLO_KEYS.items():
            message = message.replace(field, key)
        raise click.BadParameter(f"model {model!r}: {message} (targets in seconds, 1 ms to "
                                 "one hour)") from None
    return model, Targets(seconds.get("ttft_p99"), seconds.get("e2e_p99"))


def parse_model_map(items: Sequence[str]) -> dict[str, str]:
    """``SERVED=FAMILY`` pairs."""
    mapping = {}
    for item in items:
        served, equals, family = item.partition("=")
        if not equals or not served.strip() or not family.strip():
            raise click.BadParameter(f"{item!r}: expected SERVED=FAMILY, e.g. "
                                     "tiny-llama=llama-2-7b")
        mapping[served.strip()] = family.strip()
    return mapping


def history_workload(db: Database, hours: float, now: datetime | None = None) -> PlanWorkload:
    """The requests that finished in the last `hours` hours (`request_outcomes`), each arriving
    its end-to-end latency before it finished. Raises `PlanInputError` on an empty window."""
    now = now or datetime.now(UTC)
    since = now - timedelta(hours=hours)
    query = (select(RequestOutcome.finished_at, RequestOutcome.e2e_s, RequestOutcome.model_name,
                    RequestOutcome.prompt_tokens, RequestOutcome.output_tokens)
             .where(RequestOutcome.finished_at >= since, RequestOutcome.finished_at <= now))
    with db.session() as session:
        rows = session.execute(query).all()
    if not rows:
        raise PlanInputError(f"the history holds no finished request in the last {hours:g} "
                             f"hours (since {since:%Y-%m-%d %H:%M} UTC): nothing to plan for")
    origin = min(finished - timedelta(seconds=e2e) for finished, e2e, *_ in rows)
    return workload_of(PlanRequest(
        arrival_s=max(0.0, (finished - timedelta(seconds=e2e) - origin).total_seconds()),
        model=model, prompt_tokens=max(1, prompt), output_tokens=max(1, output))
        for finished, e2e, model, prompt, output in rows)


def _write_atomically(path: Path, text: str) -> None:
    """`text` into `path` in one rename: a reader sees the old file or the whole new one."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _write_fleet(plan: FleetPlan, path: Path) -> None:
    """The fleet's `BLOCKQ_FLEET` into `path`, and each derived kind's execution-time model
    into `<path's stem>.models/` beside it, which its entry names by absolute path (the models
    first: a fleet file never names a model that is not there)."""
    models_dir = (path.parent / f"{path.stem}.models").resolve()
    models = derived_models(plan)
    if models:
        models_dir.mkdir(exist_ok=True)
        for name, model in models.items():
            _write_atomically(models_dir / name,
                              json.dumps(model.to_dict(), indent=2) + "\n")
    _write_atomically(path, json.dumps(fleet_entries(plan, models_dir), indent=2) + "\n")


def _checked_output(path: Path | None, option: str) -> None:
    if path is not None and not path.parent.is_dir():
        raise click.BadParameter(f"no directory {path.parent} to write {path.name} in",
                                 param_hint=option)


def _print_plan(plan: FleetPlan, report: dict[str, Any]) -> None:
    fleet = Table(title=f"Planned fleet: {report['cost_per_hour']:.2f} per hour, headroom "
                        f"x{report['headroom']:g} the rate (x{plan.rate_scale:g} the workload's)")
    for column in ("model", "count", "GPU kind", "execution-time model", "per hour"):
        fleet.add_column(column)
    for entry in report["fleet"]:
        derived = " (datasheet)" if entry["derived"] else ""
        fleet.add_row(entry["model"], str(entry["count"]), entry["gpu_kind"],
                      entry["exec_model"] + derived,
                      f"{entry['count'] * entry['price_per_hour']:.2f}")
    console.print(fleet)
    models = Table(title="Predicted latencies at the planned rate (simulated, production router)")
    for column in ("model", "TTFT p99 s", "target", "e2e p99 s", "target", "headroom", "policy"):
        models.add_column(column)
    for model, figures in report["models"].items():
        targets = figures["targets"]
        models.add_row(model, _seconds(figures["ttft_p99_s"]), _seconds(targets["ttft_p99_s"]),
                       _seconds(figures["e2e_p99_s"]), _seconds(targets["e2e_p99_s"]),
                       f"x{figures['headroom']:g}", figures["policy"])
    console.print(models)
    others = Table(title="Alternatives, each checked in the same simulation")
    for column in ("plan", "fleet", "per hour", "meets targets", "vs plan"):
        others.add_column(column)
    for alternative in report["alternatives"]:
        fleet_text = " + ".join(f"{e['count']} {e['gpu_kind']} ({e['model']})"
                                for e in alternative["fleet"]) or "-"
        met = alternative["meets_targets"]
        cost = alternative["cost_per_hour"]
        saving = (f"{1 - report['cost_per_hour'] / cost:+.0%} saved" if met and cost else "-")
        others.add_row(alternative["name"], fleet_text, f"{cost:.2f}" if cost else "-",
                       "yes" if met else "no", saving)
    console.print(others)
    for note in plan.notes:
        console.print(f"note: {note}")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


@click.command()
@click.option("--workload", "workload_path", type=click.Path(exists=True, dir_okay=False,
              path_type=Path), help="JSONL of requests: arrival_s, model, prompt_tokens, "
              "output_tokens (optionally prompt), one a line.")
@click.option("--from-history", "history_hours", type=click.FloatRange(min=0, min_open=True),
              metavar="HOURS", help="Plan for the requests that finished in the last HOURS "
              "hours (the database's request history) instead of a file.")
@click.option("--rate-scale", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, metavar="X", help="Plan for this multiple of the workload's rate.")
@click.option("--slo", "slos", multiple=True, metavar="MODEL:ttft_p99=S[,e2e_p99=S]",
              help="A model's latency targets in seconds, at the 99th percentile; one per model.")
@click.option("--catalog", "catalog_path", type=click.Path(exists=True, dir_okay=False,
              path_type=Path), help="JSON of the GPU kinds that may be used, with prices "
              "(default: the shipped catalog).")
@click.option("--model-map", "model_maps", multiple=True, metavar="SERVED=FAMILY",
              help="The execution-time model family (llama-2-7b, llama-3-8b, qwen2-7b) a served "
              "model name runs as.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the plan as JSON here.")
@click.option("--fleet-out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the planned fleet here as a BLOCKQ_FLEET that blockq serve runs.")
@click.option("--min-requests", type=click.IntRange(min=0),
              default=PlanOptions().min_requests_per_pool, show_default=True, metavar="N",
              help="Each simulated run replays a model's workload, repeated, to at least N "
              "requests: fewer make its p99 chance, and a pool near its limit look better "
              "than it is.")
def plan(workload_path: Path | None, history_hours: float | None, rate_scale: float,
         slos: tuple[str, ...], catalog_path: Path | None, model_maps: tuple[str, ...],
         json_out: Path | None, fleet_out: Path | None, min_requests: int) -> None:
    """The cheapest fleet of GPU kinds that meets every model's latency targets, each candidate
    judged by the simulation that routes with blockq's own policy (docs/planning.md)."""
    if (workload_path is None) == (history_hours is None):
        raise click.UsageError("give one of --workload FILE or --from-history HOURS")
    _checked_output(json_out, "--json")
    _checked_output(fleet_out, "--fleet-out")
    targets: dict[str, Targets] = {}
    for text in slos:
        model, target = parse_slo(text)
        if model in targets:
            raise click.BadParameter(f"model {model!r} has two --slo targets; give one",
                                     param_hint="--slo")
        targets[model] = target
    family_of = parse_model_map(model_maps)
    settings = Settings.load()
    try:
        catalog: Catalog = load_catalog(catalog_path or DEFAULT_CATALOG)
        workload = _read_workload(workload_path, history_hours, settings)
        options = PlanOptions(single_policy=settings.routing_policy_for(mixed_hardware=False),
                              mixed_policy=settings.routing_policy_for(mixed_hardware=True),
                              publish_interval_s=settings.state_publish_interval_s,
                              min_requests_per_pool=min_requests)
        with console.status("planning: simulating candidate fleets") as status:
            result = plan_fleet(workload, targets, catalog, options, rate_scale, family_of,
                                progress=lambda message: status.update(f"planning: {message}"),
                                jobs=os.cpu_count() or 1)
    except PlanInputError as exc:
        raise click.ClickException(str(exc)) from None
    report = plan_json(result, catalog, targets)
    _print_plan(result, report)
    if json_out is not None:
        _write_atomically(json_out, json.dumps(report, indent=2) + "\n")
    if fleet_out is not None:
        _write_fleet(result, fleet_out)


def _read_workload(path: Path | None, hours: float | None, settings: Settings) -> PlanWorkload:
    if path is not None:
        with path.open() as lines:
            return parse_workload(lines, source=str(path))
    assert hours is not None
    db = Database(settings.resolved_database_url)
    try:
        return history_workload(db, hours)
    except SQLAlchemyError as exc:
        raise PlanInputError(f"cannot read the request history: {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0]}") from None
    finally:
        db.dispose()
