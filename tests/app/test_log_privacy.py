"""No prompt, output or other request content in log lines (unless `log_request_content` says
so), and logs, secrets and stored files readable by blockq's own user only, whatever the umask."""

from __future__ import annotations

import io
import logging
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.exc import SQLAlchemyError

from app.cli.stack import Stack
from domain import logs
from domain.db import Database
from domain.file_bytes import DiskFileStore
from domain.local_secrets import configured_or_generated
from domain.models import InferenceRequest
from domain.services import Services
from domain.settings import Settings
from workers.runtime import Runtime

PROMPT = "TOP-SECRET-PROMPT-of-team-a"
METADATA = "TOP-SECRET-METADATA-of-team-a"

logger = logging.getLogger("tests.log_privacy")


def failing_insert(db: Database, **fields: object) -> None:
    """Insert a request PostgreSQL refuses, and log the error as blockq's code does."""
    try:
        with db.session() as session:
            session.add(InferenceRequest(
                id="req_refused", status="queued", priority="interactive", prompt=PROMPT,
                max_tokens=8, temperature=1.0, top_p=1.0, body_sha256="0" * 64,
                **{"prompt_tokens": 1, **fields}))
    except SQLAlchemyError:
        logger.exception("could not store the request")
    else:
        pytest.fail("the insert was expected to fail")


def logged(settings: Settings, action: object) -> str:
    """What the process's log handler wrote while `action(db)` ran, in both formats."""
    out = []
    for log_format in ("json", "text"):
        configured = settings.model_copy(update={"log_format": log_format})
        stream = io.StringIO()
        logs.configure(configured, role="test", stream=stream)
        db = Services.build(configured).db
        try:
            action(db)  # type: ignore[operator]
        finally:
            db.dispose()
        out.append(stream.getvalue())
    logs.configure(settings, role="test")
    return "\n".join(out)


@pytest.mark.parametrize("fields", [
    {"prompt_tokens": 1 << 40},  # beyond PostgreSQL's integer: DataError
    {"request_metadata": {"note": METADATA, "score": float("nan")}},  # PostgreSQL json: no NaN
], ids=["integer-out-of-range", "nan-in-json"])
def test_a_failing_statement_does_not_put_request_content_in_the_logs(
        fresh_services: Settings, fields: dict[str, object]) -> None:
    text = logged(fresh_services, lambda db: failing_insert(db, **fields))
    assert "could not store the request" in text and "INSERT INTO requests" in text
    assert PROMPT not in text and METADATA not in text


def test_the_debug_setting_lets_content_into_the_logs(fresh_services: Settings) -> None:
    debug = fresh_services.model_copy(update={"log_request_content": True})
    text = logged(debug, lambda db: failing_insert(db, prompt_tokens=1 << 40))
    assert PROMPT in text


def test_every_database_of_the_api_and_the_workers_hides_parameters(
        fresh_services: Settings) -> None:
    assert Services.build(fresh_services).db.engine.hide_parameters is True
    assert Runtime(fresh_services).db.engine.hide_parameters is True
    debug = fresh_services.model_copy(update={"log_request_content": True})
    assert Runtime(debug).db.engine.hide_parameters is False


def test_content_quoted_in_a_message_or_traceback_is_cut() -> None:
    stream = io.StringIO()
    logs.configure(Settings(log_format="json"), role="test", stream=stream)
    try:
        raise ValueError(f"refused [parameters: {{'prompt': '{PROMPT}'}}]\n"
                         f'CONTEXT:  JSON data, line 1: {{"note": "{METADATA}", "x": NaN...')
    except ValueError as exc:
        logger.exception("failed: %s", exc)
    logs.configure(Settings(), role="test")
    text = stream.getvalue()
    assert "failed: refused [parameters hidden]" in text and "JSON data, line 1: (hidden)" in text
    assert PROMPT not in text and METADATA not in text


# --- file modes ------------------------------------------------------------------------------
@pytest.fixture
def open_umask() -> Iterator[None]:
    """Umask 0: whatever blockq creates would be world-readable unless it sets modes itself."""
    previous = os.umask(0)
    yield
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_generated_secrets_are_0600_in_a_0700_directory(tmp_path: Path,
                                                        open_umask: None) -> None:
    data_dir = tmp_path / "data"
    secret = configured_or_generated(None, data_dir / "webhook_secret", lambda: "whsec_abc")
    assert secret == "whsec_abc"
    assert mode(data_dir / "webhook_secret") == 0o600 and mode(data_dir) == 0o700
    # A secret file left world-readable (an older version, a copy) is tightened when read.
    loose = data_dir / "flower_basic_auth"
    loose.write_text("admin:pw")
    loose.chmod(0o644)
    assert configured_or_generated(None, loose, lambda: "unused") == "admin:pw"
    assert mode(loose) == 0o600


def test_process_logs_are_0600_in_a_0700_directory(tmp_path: Path, open_umask: None) -> None:
    stack = Stack(Settings(data_dir=tmp_path / "data"), env={})
    stack.start(names=[])
    stack.start_process("probe", [sys.executable, "-c", "print('hello')"])
    assert stack.processes["probe"].wait(timeout=30) == 0
    log = stack.log_dir / "probe.log"
    assert log.read_text() == "hello\n"
    assert mode(log) == 0o600 and mode(stack.log_dir) == 0o700
    log.chmod(0o644)  # an older, looser log is tightened when appended to again
    stack.start_process("probe", [sys.executable, "-c", "print('again')"])
    assert stack.processes["probe"].wait(timeout=30) == 0
    assert log.read_text() == "hello\nagain\n" and mode(log) == 0o600


def test_stored_files_are_0600_in_0700_directories(tmp_path: Path, open_umask: None) -> None:
    store = DiskFileStore(tmp_path / "files")
    store.save("file-abc", io.BytesIO(b"team data\n"), max_bytes=100)
    assert mode(store.path("file-abc")) == 0o600
    assert mode(store.root) == 0o700 and mode(store.root / ".tmp") == 0o700
