"""The user's side of the CLI: `blockq submit` and `blockq batch ...`, through the
OpenAI-compatible API with the official `openai` client (so they work against any blockq)."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import openai
from openai.types import Batch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

__all__ = ["submit", "batch"]

console = Console(stderr=True)
TERMINAL_BATCH = {"completed", "failed", "expired", "cancelled"}

api_options = [
    click.option("--base-url", envvar="BLOCKQ_API_URL", default="http://127.0.0.1:8000/v1",
                 show_default=True, help="The API's /v1 URL (env BLOCKQ_API_URL)."),
    click.option("--api-key", envvar="BLOCKQ_API_KEY", required=True,
                 help="Your team's API key (env BLOCKQ_API_KEY)."),
]


def with_api(function):  # type: ignore[no-untyped-def]
    for option in reversed(api_options):
        function = option(function)
    return function


def _client(base_url: str, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=2)


def _fail(exc: openai.APIError) -> None:
    message = getattr(exc, "message", str(exc))
    raise click.ClickException(f"{type(exc).__name__}: {message}")


@click.command()
@click.argument("prompt")
@click.option("--model", default=None, help="Served model (default: the first /v1/models lists).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--system", default=None, help="A system message before the prompt.")
@with_api
def submit(prompt: str, model: str | None, max_tokens: int, system: str | None, base_url: str,
           api_key: str) -> None:
    """Send one prompt as a chat completion and print the answer as it is generated."""
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}]
    client = _client(base_url, api_key)
    try:
        model = model or client.models.list().data[0].id
        stream = client.chat.completions.create(
            model=model, messages=messages, max_tokens=max_tokens, stream=True)  # type: ignore[arg-type]
        for chunk in stream:
            for choice in chunk.choices:
                sys.stdout.write(choice.delta.content or "")
                sys.stdout.flush()
    except openai.APIError as exc:
        _fail(exc)
    sys.stdout.write("\n")


@click.group()
def batch() -> None:
    """Bulk jobs through the Batch API: submit a JSONL file, follow, cancel, download."""


@batch.command("submit")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--endpoint", type=click.Choice(["/v1/chat/completions", "/v1/completions"]),
              default="/v1/chat/completions", show_default=True)
@click.option("--wait", is_flag=True, help="Follow the batch with a progress bar until it ends.")
@click.option("--metadata", "metadata", multiple=True, metavar="KEY=VALUE")
@with_api
def batch_submit(path: Path, endpoint: str, wait: bool, metadata: tuple[str, ...],
                 base_url: str, api_key: str) -> None:
    """Upload FILE (one request per line, OpenAI's batch format) and start a batch."""
    client = _client(base_url, api_key)
    try:
        with path.open("rb") as handle:
            uploaded = client.files.create(file=(path.name, handle), purpose="batch")
        created = client.batches.create(
            input_file_id=uploaded.id, endpoint=endpoint,  # type: ignore[arg-type]
            completion_window="24h", metadata=_metadata(metadata) or None)
    except openai.APIError as exc:
        _fail(exc)
    click.echo(created.id)
    if wait:
        _follow(client, created.id)


def _metadata(pairs: tuple[str, ...]) -> dict[str, str]:
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--metadata")
        result[key] = value
    return result


def _follow(client: openai.OpenAI, batch_id: str, poll_s: float = 1.0) -> Batch:
    """A live progress bar (done, failed, rate, ETA) until the batch ends."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("failed {task.fields[failed]}"), TextColumn("{task.fields[rate]}"),
               TimeRemainingColumn())
    started = time.monotonic()
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(batch_id, total=None, failed=0, rate="")
        while True:
            current = client.batches.retrieve(batch_id)
            counts = current.request_counts
            done = (counts.completed + counts.failed) if counts else 0
            rate = done / max(time.monotonic() - started, 1e-9)
            progress.update(task, completed=done, total=counts.total if counts else None,
                            failed=counts.failed if counts else 0, rate=f"{rate:.1f}/s",
                            description=f"{batch_id} {current.status}")
            if current.status in TERMINAL_BATCH:
                break
            time.sleep(poll_s)
    console.print(f"{batch_id}: {current.status}")
    return current


@batch.command("status")
@click.argument("batch_id")
@click.option("--wait", is_flag=True, help="Follow it until it ends.")
@with_api
def batch_status(batch_id: str, wait: bool, base_url: str, api_key: str) -> None:
    """Show a batch (its status, counts and files)."""
    client = _client(base_url, api_key)
    try:
        current = _follow(client, batch_id) if wait else client.batches.retrieve(batch_id)
    except openai.APIError as exc:
        _fail(exc)
    click.echo(current.model_dump_json(indent=2))
    estimate = completion_estimate_line(current.model_dump())
    if estimate:
        click.echo(estimate, err=True)  # stdout stays the Batch object's JSON


def completion_estimate_line(batch: dict[str, Any]) -> str | None:
    """blockq's completion estimate of a Batch object, in a line; None before the first one
    or once it ended."""
    estimate = batch.get("blockq") or {}
    done_at = estimate.get("estimated_completion_at")
    if done_at is None:
        return None

    def when(unix: int) -> str:
        return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

    rate = estimate.get("lines_per_s")
    meets = ("within its completion window" if estimate.get("meets_completion_window")
             else "AFTER its completion window: the fleet cannot meet it")
    return (f"estimated completion {when(done_at)}, {meets} ({estimate.get('remaining_lines')} "
            f"lines left{f' at {rate:g} lines/s' if rate else ''}; estimated "
            f"{when(estimate['estimated_at'])})")


@batch.command("cancel")
@click.argument("batch_id")
@with_api
def batch_cancel(batch_id: str, base_url: str, api_key: str) -> None:
    """Cancel a batch: unstarted lines never run; finished ones are kept."""
    try:
        cancelled = _client(base_url, api_key).batches.cancel(batch_id)
    except openai.APIError as exc:
        _fail(exc)
    click.echo(f"{batch_id}: {cancelled.status}")


@batch.command("download")
@click.argument("batch_id")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("."), show_default=True, help="Directory for the result files.")
@with_api
def batch_download(batch_id: str, out_dir: Path, base_url: str, api_key: str) -> None:
    """Save the batch's output and error files as <batch>_output.jsonl / <batch>_errors.jsonl."""
    client = _client(base_url, api_key)
    try:
        current = client.batches.retrieve(batch_id)
        out_dir.mkdir(parents=True, exist_ok=True)
        saved = []
        for file_id, suffix in ((current.output_file_id, "output"),
                                (current.error_file_id, "errors")):
            if file_id:
                target = out_dir / f"{batch_id}_{suffix}.jsonl"
                client.files.content(file_id).write_to_file(target)
                saved.append(str(target))
    except openai.APIError as exc:
        _fail(exc)
    if not saved:
        raise click.ClickException(f"{batch_id} has no result files yet ({current.status}).")
    for name in saved:
        click.echo(name)
