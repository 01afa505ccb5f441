"""Log lines: JSON objects with role and request id, plain text on demand, secrets masked."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from domain import logs
from domain.settings import Settings

Captured = tuple[io.StringIO, logging.Handler]


@pytest.fixture
def captured() -> Iterator[Captured]:
    """The handler `logs.configure` installs, writing into a buffer; removed afterwards."""
    root = logging.getLogger()
    level = root.level
    buffer = io.StringIO()
    logs.configure(Settings(log_format="json"), role="route", stream=buffer)
    handler = handler_of(buffer)
    yield buffer, handler
    root.removeHandler(handler)
    root.setLevel(level)
    logs.bind_request_id(None)


def handler_of(stream: io.StringIO) -> logging.Handler:
    return next(h for h in logging.getLogger().handlers if getattr(h, "stream", None) is stream)


def lines(buffer: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines()]


def test_json_lines_carry_role_and_request_id_when_known(captured: Captured) -> None:
    buffer, _ = captured
    log = logging.getLogger("blockq.test")
    log.info("no request yet")
    logs.bind_request_id("req_" + "a" * 32)
    log.warning("routed %s", "somewhere", extra={"instance_id": "gpu.1"})
    first, second = lines(buffer)
    assert list(first)[:4] == ["time", "level", "logger", "message"]
    assert first["role"] == "route" and "request_id" not in first
    assert second == {**second, "level": "WARNING", "logger": "blockq.test",
                      "message": "routed somewhere", "role": "route",
                      "request_id": "req_" + "a" * 32, "instance_id": "gpu.1"}
    assert second["time"].endswith("+00:00")


def test_a_new_configure_replaces_the_handler_and_can_write_text(captured: Captured) -> None:
    _, handler = captured
    buffer = io.StringIO()
    logs.configure(Settings(log_format="text"), role="api", stream=buffer)
    assert handler not in logging.getLogger().handlers
    logs.bind_request_id("req_" + "b" * 32)
    logging.getLogger("blockq.test").info("hello")
    line = buffer.getvalue().strip()
    assert line.endswith(f"INFO api blockq.test [req_{'b' * 32}] hello")
    logging.getLogger().removeHandler(handler_of(buffer))


def test_secrets_never_reach_the_output(captured: Captured) -> None:
    buffer, _ = captured
    key = "bq-" + "K" * 43
    secret = "whsec_dGVzdC1zZWNyZXQtZm9yLWJsb2NrcS13ZWJob29rcw=="
    log = logging.getLogger("blockq.test")
    log.info("key %s and %s", key, secret, extra={"url": "redis://:hunter2@redis:6379/0"})
    try:
        raise RuntimeError(f"failed with {key}")
    except RuntimeError:
        log.exception("boom")
    text = buffer.getvalue()
    assert key not in text and secret not in text and "hunter2" not in text
    assert "bq-***" in text and "whsec_***" in text and "redis://:***@redis:6379/0" in text


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        (["req_" + "c" * 32], {}, "req_" + "c" * 32),
        (["req_" + "c" * 32, 2], {}, "req_" + "c" * 32),
        ([], {"request_id": "req_d"}, "req_d"),
        (["batch_1"], {}, None),
        ([], {}, None),
        (None, None, None),
    ],
)
def test_the_request_id_of_a_task(
    args: list[Any] | None, kwargs: dict[str, Any] | None, expected: str | None
) -> None:
    assert logs.request_id_of(args, kwargs) == expected
