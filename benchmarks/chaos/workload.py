"""The mixed job: native requests with webhooks, OpenAI-compatible calls (streamed and not) and
batches, sent at a steady pace from client threads that retry until accepted."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import random
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from app.cli.stack import Stack
from benchmarks.chaos.config import RunConfig
from benchmarks.chaos.receiver import WebhookReceiver

MODEL = "tiny-llama"
CHAT = "/v1/chat/completions"
#: Shares of the job by kind (batch lines are requests too).
MIX = {"native": 0.32, "chat": 0.12, "chat_stream": 0.12, "completion": 0.12,
       "completion_stream": 0.12, "batch": 0.20}
TOPICS = ("queues", "leases", "outboxes", "heartbeats", "retries", "webhooks", "batches",
          "idempotency", "backoff", "consensus", "sharding", "replication")


@dataclass
class Outcome:
    """What one client saw of one request (or, for kind "batch", of one batch)."""

    kind: str
    request_id: str | None = None  # the batch id for kind "batch"
    accepted: bool = False
    tries: int = 0
    # HTTP status (or exception name) of every try that was not accepted.
    refusals: list[str] = field(default_factory=list)
    text: str | None = None  # the answer returned (non-streamed OpenAI calls) or streamed
    interrupted: str | None = None  # why a stream ended early: its error code, or the transport
    note: str | None = None  # gave_up | refused <status> | timeout | failed
    lines: int = 0  # batches: lines in the input file
    team: str | None = None
    #: The Idempotency-Key every try of an OpenAI completion sends: a retry joins the first.
    key: str | None = None


class Retry(Exception):
    """This try was not accepted and may be retried: `reason` says what the client saw."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


#: Transport errors of our HTTP client and of the openai client's (httpx2 since openai 3: its
#: `Timeout` is httpx2's too, and a stream broken mid-read raises httpx2's errors).
_HTTP_ERRORS: tuple[type[Exception], ...] = (httpx.HTTPError,) + (
    (importlib.import_module("httpx2").HTTPError,) if importlib.util.find_spec("httpx2") else ())

_REQUEST_ID = re.compile(r"\b(req_[A-Za-z0-9]+)")


def _request_id_of(response_id: str) -> str:
    return "req_" + response_id.split("-", 1)[1]


def _until_accepted(outcome: Outcome, attempt: Callable[[], None], deadline: float,
                    statuses: Counter[str]) -> None:
    """Calls `attempt` until it returns (accepted) or raises something but Retry; backs off
    between tries, gives up at `deadline`."""
    delay = 0.2
    while True:
        outcome.tries += 1
        try:
            attempt()
            return
        except Retry as refused:
            outcome.refusals.append(refused.reason)
            statuses[refused.reason] += 1
        if time.monotonic() + delay > deadline:
            outcome.note = "gave_up"
            return
        time.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, 3.0)


def _openai_status(error: openai.APIStatusError) -> tuple[int, str | None, str]:
    body = error.body if isinstance(error.body, dict) else {}
    inner = body.get("error", body) if isinstance(body, dict) else {}
    code = inner.get("code") if isinstance(inner, dict) else None
    message = inner.get("message", "") if isinstance(inner, dict) else ""
    return error.status_code, code, message or str(error)


class Workload:
    """Sends the mixed job at a steady pace from a pool of client threads; every client retries
    until its request is accepted (2xx) or the deadline passes."""

    def __init__(self, stack: Stack, receiver: WebhookReceiver, team_keys: dict[str, str],
                 config: RunConfig, *, deadline: float) -> None:
        self.stack, self.receiver, self.config = stack, receiver, config
        self.team_keys = team_keys
        self.deadline = deadline
        self.outcomes: list[Outcome] = []
        self.statuses: Counter[str] = Counter()  # every answer a client got, accepted or not
        self.lock = threading.Lock()
        self.native = stack.client(timeout=httpx.Timeout(30, connect=5))
        self.openai = openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key=stack.api_key,
                                    max_retries=0, timeout=openai.Timeout(
                                        config.sync_timeout_s + 30, connect=5))
        self.team_clients = {
            team: openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key=key, max_retries=0,
                                timeout=openai.Timeout(60, connect=5))
            for team, key in team_keys.items()}
        self.submitted = 0  # requests (batch lines included) handed to a client so far

    def plan(self, rng: random.Random) -> list[tuple[str, int]]:
        """(kind, requests) of each job in order: batches hold several requests each."""
        total = self.config.requests
        batch_lines = int(total * MIX["batch"])
        per_batch = max(5, min(50, batch_lines // 4))
        jobs: list[tuple[str, int]] = []
        kinds = [k for k in MIX if k != "batch"]
        weights = [MIX[k] for k in kinds]
        for _ in range(total - batch_lines):
            jobs.append((rng.choices(kinds, weights)[0], 1))
        remaining = batch_lines
        while remaining > 0:
            size = min(per_batch, remaining)
            jobs.insert(rng.randrange(len(jobs) + 1), ("batch", size))
            remaining -= size
        return jobs

    def run(self, start: float, duration_s: float, rng: random.Random) -> None:
        """Spreads the jobs evenly over `duration_s` from `start` (monotonic time)."""
        jobs = self.plan(rng)
        total = sum(size for _, size in jobs)
        sent = 0
        with ThreadPoolExecutor(self.config.clients) as pool:
            for number, (kind, size) in enumerate(jobs):
                at = start + duration_s * sent / total
                time.sleep(max(0.0, at - time.monotonic()))
                job_rng = random.Random(rng.random())
                pool.submit(self._one, number, kind, size, job_rng)
                sent += size
                self.submitted = sent

    def _one(self, number: int, kind: str, size: int, rng: random.Random) -> None:
        outcome = Outcome(kind)
        try:
            if kind == "batch":
                self._batch(outcome, number, size, rng)
            elif kind == "native":
                self._native(outcome, number, rng)
            elif kind.endswith("_stream"):
                self._stream(outcome, kind.removesuffix("_stream"), number, rng)
            else:
                self._sync(outcome, kind, number, rng)
        except Exception as error:  # noqa: BLE001 - a client bug must show, not kill the thread
            outcome.note = f"client error: {type(error).__name__}: {error}"
        with self.lock:
            self.outcomes.append(outcome)

    def _prompt(self, number: int, rng: random.Random) -> str:
        return (f"Question {number}: explain {rng.choice(TOPICS)} and "
                f"{rng.choice(TOPICS)} in {rng.randint(1, 9)} sentences.")

    def _count(self, status: str) -> None:
        with self.lock:
            self.statuses[status] += 1

    # native ----------------------------------------------------------------------------------
    def _native(self, outcome: Outcome, number: int, rng: random.Random) -> None:
        body = {"prompt": self._prompt(number, rng), "max_tokens": rng.randint(8, 128),
                "webhook_url": f"{self.receiver.url}/requests",
                "metadata": {"chaos": str(number)}}
        headers = {"Idempotency-Key": f"chaos-{uuid.uuid4().hex}"}

        def attempt() -> None:
            try:
                response = self.native.post("/v1/requests", json=body, headers=headers)
            except httpx.HTTPError as error:
                raise Retry(type(error).__name__) from error
            self._count(str(response.status_code))
            if response.status_code in (429,) or response.status_code >= 500:
                raise Retry(str(response.status_code))
            if response.status_code != 202:
                outcome.note = f"refused {response.status_code}: {response.text[:200]}"
                return
            outcome.accepted, outcome.request_id = True, response.json()["id"]

        _until_accepted(outcome, attempt, self.deadline, Counter())

    # OpenAI-compatible, not streamed ----------------------------------------------------------
    def _create(self, kind: str, number: int, rng: random.Random, key: str,
                **extra: Any) -> Any:
        """One try of the call; every try sends the same body and key (`rng` is reseeded)."""
        rng = random.Random(key)
        extra["extra_headers"] = {"Idempotency-Key": key}
        max_tokens = rng.randint(8, 96)
        if kind == "chat":
            return self.openai.chat.completions.create(
                model=MODEL, max_tokens=max_tokens,
                messages=[{"role": "user", "content": self._prompt(number, rng)}], **extra)
        return self.openai.completions.create(model=MODEL, max_tokens=max_tokens,
                                              prompt=self._prompt(number, rng), **extra)

    def _classify(self, outcome: Outcome, error: Exception) -> None:
        """An OpenAI call that raised: accepted-and-failed, or a refusal to retry."""
        if isinstance(error, openai.APIStatusError):
            status, code, message = _openai_status(error)
            self._count(str(status))
            found = _REQUEST_ID.search(message)
            # 504: the request goes on; generation_failed: it was accepted and failed.
            if found and (status == 504 or code in ("generation_failed", "timeout")):
                outcome.accepted, outcome.request_id = True, found.group(1)
                outcome.note = "timeout" if status == 504 else "failed"
                return
            if status == 429 or status >= 500:
                raise Retry(str(status)) from error
            outcome.note = f"refused {status}: {message[:200]}"
            return
        if isinstance(error, (openai.APIConnectionError, *_HTTP_ERRORS)):
            raise Retry(type(error).__name__) from error
        raise error

    def _sync(self, outcome: Outcome, kind: str, number: int, rng: random.Random) -> None:
        outcome.key = f"chaos-{uuid.UUID(int=rng.getrandbits(128)).hex}"

        def attempt() -> None:
            assert outcome.key is not None
            try:
                response = self._create(kind, number, rng, outcome.key)
            except Exception as error:  # noqa: BLE001 - sorted by _classify
                self._classify(outcome, error)
                return
            self._count("200")
            outcome.accepted, outcome.request_id = True, _request_id_of(response.id)
            choice = response.choices[0]
            outcome.text = choice.message.content if kind == "chat" else choice.text

        _until_accepted(outcome, attempt, self.deadline, Counter())

    # OpenAI-compatible, streamed --------------------------------------------------------------
    def _stream(self, outcome: Outcome, kind: str, number: int, rng: random.Random) -> None:
        outcome.key = f"chaos-{uuid.UUID(int=rng.getrandbits(128)).hex}"

        def attempt() -> None:
            assert outcome.key is not None
            try:
                stream = self._create(kind, number, rng, outcome.key, stream=True)
            except Exception as error:  # noqa: BLE001 - sorted by _classify
                self._classify(outcome, error)
                return
            self._count("200")
            outcome.accepted, outcome.text = True, ""
            # Known before any event: a stream cut before its first chunk is still checked.
            outcome.request_id = stream.response.headers.get("x-request-id")
            self._read_stream(outcome, kind, stream)

        _until_accepted(outcome, attempt, self.deadline, Counter())

    def _read_stream(self, outcome: Outcome, kind: str, stream: Any) -> None:
        pieces: list[str] = []
        try:
            for chunk in stream:
                if outcome.request_id is None and chunk.id:
                    outcome.request_id = _request_id_of(chunk.id)
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                pieces.append((choice.delta.content if kind == "chat" else choice.text) or "")
        except openai.APIError as error:  # an error event in the stream
            outcome.interrupted = str(getattr(error, "code", None) or "error")
        except (*_HTTP_ERRORS, openai.APIConnectionError) as error:
            outcome.interrupted = f"transport: {type(error).__name__}"
        finally:
            outcome.text = "".join(pieces)
            with contextlib.suppress(Exception):
                stream.close()

    # batches ----------------------------------------------------------------------------------
    def _batch(self, outcome: Outcome, number: int, size: int, rng: random.Random) -> None:
        team = sorted(self.team_keys)[number % len(self.team_keys)]
        client = self.team_clients[team]
        outcome.team, outcome.lines = team, size
        lines = [{"custom_id": f"b{number}-{i}", "method": "POST", "url": CHAT,
                  "body": {"model": MODEL, "max_tokens": rng.randint(2, 16),
                           "messages": [{"role": "user", "content": self._prompt(number, rng)}]}}
                 for i in range(size)]
        data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
        file_id: list[str] = []

        def attempt() -> None:
            try:
                if not file_id:
                    file_id.append(client.files.create(file=("input.jsonl", data),
                                                       purpose="batch").id)
                    self._count("200")
                batch = client.batches.create(input_file_id=file_id[0], endpoint=CHAT,
                                              completion_window="24h")
            except Exception as error:  # noqa: BLE001 - sorted by _classify
                self._classify(outcome, error)
                return
            self._count("200")
            outcome.accepted, outcome.request_id = True, batch.id

        _until_accepted(outcome, attempt, self.deadline, Counter())

    def close(self) -> None:
        self.native.close()
        self.openai.close()
        for client in self.team_clients.values():
            client.close()
