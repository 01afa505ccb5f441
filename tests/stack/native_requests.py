"""The native requests API as the stack tests drive it: submit, then poll until terminal."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

TERMINAL = {"succeeded", "failed", "cancelled"}


def submit(client: httpx.Client, **body: Any) -> str:
    """POST /v1/requests; the new request's id."""
    response = client.post("/v1/requests", json=body)
    assert response.status_code == 202, response.text
    return response.json()["id"]


def wait_terminal(
    client: httpx.Client,
    ids: list[str],
    timeout_s: float = 120,
    seen: dict[str, list[str]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Each request's body once it is terminal; `seen` collects the statuses polled on the way.

    Fails the test, showing a few unfinished requests, when `timeout_s` passes first.
    """
    done: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while len(done) < len(ids):
        if time.monotonic() > deadline:
            stuck = [client.get(f"/v1/requests/{i}").json() for i in ids if i not in done]
            pytest.fail(
                f"{len(stuck)} requests unfinished: "
                + json.dumps(
                    [
                        {k: r[k] for k in ("id", "status", "instance_id", "attempt", "events")}
                        for r in stuck[:3]
                    ],
                    indent=1,
                )
            )
        for request_id in ids:
            if request_id in done:
                continue
            body = client.get(f"/v1/requests/{request_id}").json()
            if seen is not None and (
                not seen[request_id] or seen[request_id][-1] != body["status"]
            ):
                seen[request_id].append(body["status"])
            if body["status"] in TERMINAL:
                done[request_id] = body
        time.sleep(0.05)
    return done
