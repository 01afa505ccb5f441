"""Chaos benchmark: the real stack under a mixed load while its parts are killed, then checked.

Starts its own PostgreSQL (initdb into a temporary directory) and its own Redis, each on a free
port of 127.0.0.1, so that killing them disturbs nothing else on the machine; runs the
migrations; starts the real blockq stack on them (`app.cli.stack.Stack`, emulated engines in
scaled time, no Flower) and sends a mixed job: native requests with webhooks to a receiver that
fails the first attempts of each event, OpenAI-compatible chat and text completions (streamed
and not, with the `openai` client), and two teams' batches. Meanwhile faults hit at random
times (seeded): SIGKILL and SIGTERM of every process kind, SIGSTOP of an engine beyond the
heartbeat TTL, Redis killed and restarted empty, PostgreSQL restarted (immediate) and its
connections terminated, and the crash-after-commit fault point. When the faults stop and the
system settles, it checks the delivery guarantees from PostgreSQL, the webhook receiver, the
clients' records and Redis, and prints what it found (docs/chaos.md says what each line means).

    .venv/bin/python scripts/chaos.py --requests 5000 --faults-per-kind 20 --json chaos.json
    .venv/bin/python scripts/chaos.py --requests 300 --faults-per-kind 1 \\
        --kinds sigkill:route,redis:restart-empty

Exit status 0 when every invariant holds, 1 otherwise. tests/stack/test_chaos.py runs a short
run through `run()` (it imports this file by path, as the serve tests import build_tiny_model).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from statistics import median
from typing import Any

import httpx
import openai
import psycopg
import redis
from rich.console import Console
from rich.table import Table
from sqlalchemy import func, select

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.cli.stack import Stack, process_commands  # noqa: E402
from app.db import Database  # noqa: E402
from app.migrate import upgrade  # noqa: E402
from app.models import (  # noqa: E402
    TERMINAL_STATUSES,
    Batch,
    BatchLine,
    InferenceRequest,
    RequestEvent,
    Team,
)
from app.queues import SERVICE_QUEUES, queue_depths  # noqa: E402
from app.settings import Settings  # noqa: E402
from app.teams import create_team, issue_key  # noqa: E402
from workers.webhooks.events import event_id  # noqa: E402
from workers.webhooks.signing import new_secret, verify  # noqa: E402

__all__ = ["RunConfig", "RunResult", "run", "main"]

MODEL = "tiny-llama"
CHAT = "/v1/chat/completions"
#: Environment variable of app/faults.py: a process exits right after a commit whose message
#: (outbox entry) has not been sent yet, with this probability per such commit.
CRASH_AFTER_COMMIT_ENV = "BLOCKQ_FAULT_CRASH_AFTER_COMMIT"
#: Exit status of a process the crash-after-commit fault point ended.
CRASH_AFTER_COMMIT_EXIT = 70
TERMINAL = {str(s) for s in TERMINAL_STATUSES}
TERMINAL_BATCH = {"completed", "failed", "expired", "cancelled"}
#: Shares of the job by kind (batch lines are requests too).
MIX = {"native": 0.32, "chat": 0.12, "chat_stream": 0.12, "completion": 0.12,
       "completion_stream": 0.12, "batch": 0.20}
TOPICS = ("queues", "leases", "outboxes", "heartbeats", "retries", "webhooks", "batches",
          "idempotency", "backoff", "consensus", "sharding", "replication")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- the run's own PostgreSQL and Redis ---------------------------------------------------------


class OwnServices:
    """A PostgreSQL server and a Redis server of this run only, in a temporary directory."""

    DATABASE = "blockq_chaos"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pg_dir = root / "pg"
        self.pg_port = free_port()
        self.redis_port = free_port()
        self.redis_process: subprocess.Popen[bytes] | None = None

    @property
    def database_url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.pg_port}/{self.DATABASE}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root: its files are postgres's
            shutil.chown(self.root, "postgres")
        self._as_postgres(["initdb", "-D", str(self.pg_dir), "-U", "postgres", "--auth=trust",
                           "-E", "UTF8", "--no-sync"])
        self._pg_ctl("start")
        with psycopg.connect(self._admin_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {self.DATABASE}")
        self.start_redis()

    def stop(self) -> None:
        self.kill_redis()
        with contextlib.suppress(subprocess.CalledProcessError):
            self._pg_ctl("stop", "-m", "immediate")

    # PostgreSQL ---------------------------------------------------------------------------------
    @property
    def _admin_dsn(self) -> str:
        return f"host=127.0.0.1 port={self.pg_port} user=postgres dbname=postgres"

    def _as_postgres(self, command: list[str]) -> None:
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, timeout=120, check=False)
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): "
                               f"{(done.stderr or done.stdout).decode(errors='replace')[-800:]}")

    def _pg_ctl(self, action: str, *extra: str) -> None:
        # fsync off: a crash of the server (not of the OS) loses nothing; commits stay synchronous.
        options = (f"-p {self.pg_port} -k {self.pg_dir} -c listen_addresses=127.0.0.1 "
                   "-c max_connections=400 -c fsync=off")
        self._as_postgres(["pg_ctl", "-D", str(self.pg_dir), "-l", str(self.root / "pg.log"),
                           "-w", "-t", "60", "-o", options, action, *extra])

    def restart_postgres(self) -> None:
        """`pg_ctl -m immediate restart`: every backend dies at once, then crash recovery."""
        self._pg_ctl("restart", "-m", "immediate")

    def terminate_connections(self) -> int:
        """Ends every connection to the stack's database; how many there were."""
        with psycopg.connect(self._admin_dsn, autocommit=True, connect_timeout=5) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()", (self.DATABASE,)).fetchall()
        return len(rows)

    # Redis --------------------------------------------------------------------------------------
    def start_redis(self) -> None:
        """A Redis server that keeps nothing on disk: each start is an empty one."""
        redis_dir = self.root / "redis"
        redis_dir.mkdir(exist_ok=True)
        log = open(self.root / "redis.log", "ab")  # noqa: SIM115 - lives with the process
        self.redis_process = subprocess.Popen(
            ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(redis_dir)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        client = redis.Redis.from_url(self.redis_url, socket_timeout=1)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.close()

    def kill_redis(self) -> None:
        if self.redis_process is not None and self.redis_process.poll() is None:
            self.redis_process.kill()
            self.redis_process.wait()


# --- the webhook receiver ------------------------------------------------------------------------


@dataclass
class Delivery:
    path: str
    webhook_id: str
    payload: dict[str, Any] | None
    signature_ok: bool
    answered: int
    at: float


class WebhookReceiver:
    """Records every delivery and checks its signature; answers 500 to the first `fail_first`
    attempts of each event (by webhook-id), 200 after."""

    def __init__(self, secret: str, fail_first: int) -> None:
        self.deliveries: list[Delivery] = []
        self.lock = threading.Lock()
        attempts: Counter[str] = Counter()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                webhook_id = headers.get("webhook-id", "")
                try:
                    signature_ok = verify(secret, headers, body)
                except (KeyError, ValueError):
                    signature_ok = False
                try:
                    payload = json.loads(body)
                except ValueError:
                    payload = None
                with receiver.lock:
                    attempts[webhook_id] += 1
                    answered = 500 if attempts[webhook_id] <= fail_first else 200
                    receiver.deliveries.append(Delivery(self.path, webhook_id, payload,
                                                        signature_ok, answered, time.time()))
                self.send_response(answered)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def snapshot(self) -> list[Delivery]:
        with self.lock:
            return list(self.deliveries)

    def close(self) -> None:
        self.server.shutdown()


# --- the workload --------------------------------------------------------------------------------


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


class Retry(Exception):
    """This try was not accepted and may be retried: `reason` says what the client saw."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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
                                    max_retries=0, timeout=httpx.Timeout(
                                        config.sync_timeout_s + 30, connect=5))
        self.team_clients = {
            team: openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key=key, max_retries=0,
                                timeout=httpx.Timeout(60, connect=5))
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
    def _create(self, kind: str, number: int, rng: random.Random, **extra: Any) -> Any:
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
        if isinstance(error, (openai.APIConnectionError, httpx.HTTPError)):
            raise Retry(type(error).__name__) from error
        raise error

    def _sync(self, outcome: Outcome, kind: str, number: int, rng: random.Random) -> None:
        def attempt() -> None:
            try:
                response = self._create(kind, number, rng)
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
        def attempt() -> None:
            try:
                stream = self._create(kind, number, rng, stream=True)
            except Exception as error:  # noqa: BLE001 - sorted by _classify
                self._classify(outcome, error)
                return
            self._count("200")
            outcome.accepted, outcome.text = True, ""
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
        except (httpx.HTTPError, openai.APIConnectionError) as error:
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


# --- processes: signals, exits, supervision ------------------------------------------------------


@dataclass
class Exit:
    name: str
    pid: int
    code: int | None
    at: float  # wall time it was noticed
    cause: str | None  # the fault kind that signalled it, or None: it died by itself


class ProcessWatch:
    """Notices every exit of a stack process (its code, and the fault that caused it if one
    did) by polling `stack.processes`, where the supervisor puts each restarted process."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.exits: list[Exit] = []
        self.signalled: dict[int, str] = {}  # pid -> fault kind
        self.known: dict[str, subprocess.Popen[bytes]] = dict(stack.processes)
        self.recorded: set[int] = set()  # pids whose exit is noted
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="process-watch", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)

    def signal(self, name: str, sig: int, cause: str) -> None:
        """Sends `sig` to the process `name` (Stack.signal) and notes why."""
        process = self.stack.processes[name]
        with self.lock:
            self.signalled[process.pid] = cause
        self.stack.signal(name, sig)

    def forget(self, name: str) -> None:
        """The signal sent to `name` did not end it (SIGSTOP, then SIGCONT)."""
        with self.lock:
            self.signalled.pop(self.stack.processes[name].pid, None)

    def all_running(self) -> bool:
        return all(p.poll() is None for p in list(self.stack.processes.values()))

    def _run(self) -> None:
        while not self.stopping.wait(0.1):
            now = time.time()
            for name, process in list(self.stack.processes.items()):
                known = self.known.get(name)
                if known is not None and known is not process:  # the supervisor restarted it
                    self._exited(name, known, now)
                    self.known[name] = process
                if process.poll() is not None:
                    self._exited(name, process, now)

    def _exited(self, name: str, process: subprocess.Popen[bytes], now: float) -> None:
        if process.pid in self.recorded:
            return
        self.recorded.add(process.pid)
        with self.lock:
            cause = self.signalled.pop(process.pid, None)
            self.exits.append(Exit(name, process.pid, process.poll(), now, cause))


# --- faults --------------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    target: str
    start: float  # wall time
    end: float  # wall time the fault ended (signal sent, server back, process resumed)
    fleet_back_s: float | None = None  # end -> every process up, API ready, engines alive
    note: str = ""
    #: The process a SIGKILL or SIGTERM ended (not in the JSON result).
    victim: Any = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "start": self.start, "end": self.end,
                "fleet_back_s": self.fleet_back_s, "note": self.note}


def fault_kinds(settings: Settings) -> list[str]:
    """Every fault kind of this stack: the process kinds come from process_commands."""
    instances = set(settings.instance_ids)
    groups = sorted({"gpu" if name in instances else name
                     for name in process_commands(settings) if name != "flower"})
    return ([f"sigkill:{g}" for g in groups] + [f"sigterm:{g}" for g in groups]
            + ["sigstop:gpu", "redis:restart-empty", "postgres:restart-immediate",
               "postgres:terminate-connections", "control:no-fault"])


class Injector:
    """Injects the scheduled faults one at a time: each at a random moment of its slot of the
    traffic, and not before the system is whole again after the previous one."""

    def __init__(self, stack: Stack, services: OwnServices, watch: ProcessWatch,
                 config: RunConfig, rng: random.Random) -> None:
        self.stack, self.services, self.watch = stack, services, watch
        self.config, self.rng = config, rng
        self.faults: list[Fault] = []
        self.redis = redis.Redis.from_url(services.redis_url, socket_timeout=1,
                                          socket_connect_timeout=1)
        self.http = httpx.Client(base_url=stack.api_url, timeout=2)

    def run(self, schedule: list[str], start: float, duration_s: float,
            stop: threading.Event) -> None:
        for number, kind in enumerate(schedule):
            slot = start + duration_s * (number + self.rng.random()) / len(schedule)
            while time.monotonic() < slot and not stop.is_set():
                time.sleep(0.05)
            if stop.is_set():
                return
            fault = self.inject(kind)
            fault.fleet_back_s = self.wait_fleet_back(fault)
            self.faults.append(fault)

    def inject(self, kind: str) -> Fault:
        action, what = kind.split(":")
        ttl = self.stack.settings.heartbeat_ttl_s
        instances = self.stack.settings.instance_ids
        target = self.rng.choice(instances) if what == "gpu" else what
        start = time.time()
        note = ""
        victim = None
        if action in ("sigkill", "sigterm"):
            victim = self.stack.processes[target]
            self.watch.signal(target, signal.SIGKILL if action == "sigkill" else signal.SIGTERM,
                              kind)
        elif action == "sigstop":
            self.watch.signal(target, signal.SIGSTOP, kind)
            time.sleep(ttl * self.rng.uniform(1.5, 2.5))
            self.watch.signal(target, signal.SIGCONT, kind)
            self.watch.forget(target)
        elif kind == "redis:restart-empty":
            target = "redis"
            self.services.kill_redis()
            time.sleep(self.rng.uniform(0.5, 3.0))
            self.services.start_redis()
        elif kind == "postgres:restart-immediate":
            target = "postgres"
            self.services.restart_postgres()
        elif kind == "postgres:terminate-connections":
            target = "postgres"
            note = f"{self.services.terminate_connections()} connections"
        elif kind != "control:no-fault":
            raise ValueError(f"unknown fault kind {kind!r}")
        return Fault(kind, target, start, time.time(), note=note, victim=victim)

    def wait_fleet_back(self, fault: Fault) -> float | None:
        """Seconds from the fault's end until the process it ended (if it ended one) was
        started again, every process runs, the API is ready and every engine has a fresh
        heartbeat; None if that takes longer than the recovery timeout."""
        deadline = time.monotonic() + self.config.recover_timeout_s
        while time.monotonic() < deadline:
            replaced = fault.victim is None or \
                self.stack.processes.get(fault.target) is not fault.victim
            if replaced and self.watch.all_running() and self._api_ready() \
                    and self._engines_alive():
                return time.time() - fault.end
            time.sleep(0.1)
        return None

    def _api_ready(self) -> bool:
        try:
            return self.http.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    def _engines_alive(self) -> bool:
        keys = [f"blockq:instance:{i}:alive" for i in self.stack.settings.instance_ids]
        try:
            return self.redis.exists(*keys) == len(keys)
        except redis.RedisError:
            return False

    def close(self) -> None:
        self.redis.close()
        self.http.close()


# --- checks --------------------------------------------------------------------------------------


@dataclass
class Finding:
    """One invariant: how many violate it, and a few stories (ids and what happened)."""

    name: str
    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, story: str) -> None:
        self.count += 1
        if len(self.examples) < 8:
            self.examples.append(story)


def _story(row: Any, events: list[tuple[str, Any, str | None]]) -> str:
    trail = " > ".join(f"{status}@{at:%H:%M:%S.%f}"[:-3] + (f"({detail[:60]})" if detail else "")
                       for status, at, detail in events[-8:])
    return (f"{row.id} status={row.status} instance={row.instance_id} attempt={row.attempt} "
            f"created={row.created_at:%H:%M:%S} events: {trail}")


class Checker:
    """The guarantees, checked after the run from PostgreSQL, the receiver, clients and Redis."""

    def __init__(self, db: Database, services: OwnServices, settings: Settings,
                 receiver: WebhookReceiver, outcomes: list[Outcome],
                 team_keys: dict[str, str], api_url: str) -> None:
        """`team_keys`: team id -> an API key of the team."""
        self.db, self.services, self.settings = db, services, settings
        self.receiver, self.outcomes = receiver, outcomes
        self.team_keys, self.api_url = team_keys, api_url
        self.findings: dict[str, Finding] = {}

    def finding(self, name: str) -> Finding:
        return self.findings.setdefault(name, Finding(name))

    def run(self) -> dict[str, Finding]:
        for name in ("accepted but no row", "lost (not terminal)", "completed twice",
                     "terminal without terminal event", "output over max_tokens",
                     "webhooks missing", "webhook bad signature", "webhook-id mismatch",
                     "webhook conflicting events", "batch inconsistencies",
                     "batch webhooks missing", "stream mismatches", "answer mismatches",
                     "leftover assignments", "leftover queue messages"):
            self.finding(name)
        with self.db.session() as session:
            rows = {r.id: r for r in session.scalars(select(InferenceRequest))}
            events: dict[str, list[tuple[str, Any, str | None]]] = defaultdict(list)
            for request_id, status, at, detail in session.execute(
                    select(RequestEvent.request_id, RequestEvent.status, RequestEvent.at,
                           RequestEvent.detail).order_by(RequestEvent.id)):
                events[request_id].append((status, at, detail))
            self._requests(rows, events)
            self._webhooks(rows, events)
            self._answers(rows, events)
            self._batches(session, rows)
        self._leftovers()
        return self.findings

    def _requests(self, rows: dict[str, Any], events: dict[str, list[Any]]) -> None:
        for outcome in self.outcomes:
            if outcome.accepted and outcome.kind != "batch" and outcome.request_id not in rows:
                self.finding("accepted but no row").add(f"{outcome.kind} {outcome.request_id}")
        for row in rows.values():
            terminal_events = [e for e in events[row.id] if e[0] in TERMINAL]
            if row.status not in TERMINAL:
                self.finding("lost (not terminal)").add(_story(row, events[row.id]))
            elif not terminal_events:
                self.finding("terminal without terminal event").add(_story(row, events[row.id]))
            if len(terminal_events) > 1:
                self.finding("completed twice").add(_story(row, events[row.id]))
            if row.status == "succeeded" and (row.output_tokens is None
                                              or row.output_tokens > row.max_tokens):
                self.finding("output over max_tokens").add(
                    f"{row.id} output_tokens={row.output_tokens} max_tokens={row.max_tokens}")

    def _webhooks(self, rows: dict[str, Any], events: dict[str, list[Any]]) -> None:
        by_request: dict[str, list[Delivery]] = defaultdict(list)
        for delivery in self.receiver.snapshot():
            if not delivery.signature_ok:
                self.finding("webhook bad signature").add(
                    f"{delivery.webhook_id} {delivery.path}")
            payload = delivery.payload or {}
            subject = (payload.get("data") or {}).get("id", "?")
            expected = event_id(subject, payload.get("type", "?"))
            if delivery.webhook_id != expected or payload.get("id") != expected:
                self.finding("webhook-id mismatch").add(
                    f"{subject} {payload.get('type')} header={delivery.webhook_id} "
                    f"payload={payload.get('id')} expected={expected}")
            if delivery.path == "/requests":
                by_request[subject].append(delivery)
        for row in rows.values():
            if not row.webhook_url or row.status not in TERMINAL:
                continue
            deliveries = by_request.get(row.id, [])
            types = {(d.payload or {}).get("type") for d in deliveries}
            if len(types) > 1:
                self.finding("webhook conflicting events").add(
                    f"{row.id} final={row.status} events={sorted(map(str, types))}")
            wanted = f"request.{row.status}"
            if not any(d.answered < 300 and d.signature_ok
                       and (d.payload or {}).get("type") == wanted for d in deliveries):
                seen = [f"{(d.payload or {}).get('type')}->{d.answered}" for d in deliveries]
                self.finding("webhooks missing").add(
                    f"{_story(row, events[row.id])} deliveries={seen}")

    def _answers(self, rows: dict[str, Any], events: dict[str, list[Any]]) -> None:
        for outcome in self.outcomes:
            if not outcome.accepted or outcome.text is None or outcome.request_id not in rows:
                continue
            row = rows[outcome.request_id]
            if row.status != "succeeded" or outcome.interrupted:
                continue
            if outcome.text != (row.output_text or ""):
                name = "stream mismatches" if outcome.kind.endswith("_stream") else \
                    "answer mismatches"
                self.finding(name).add(
                    f"{row.id} client got {len(outcome.text)} chars, stored "
                    f"{len(row.output_text or '')}: {_story(row, events[row.id])}")

    def _batches(self, session: Any, rows: dict[str, Any]) -> None:
        accepted = {o.request_id: o for o in self.outcomes if o.kind == "batch" and o.accepted}
        deliveries = [d for d in self.receiver.snapshot() if d.path == "/batches"]
        teams = {t.id: t for t in session.scalars(select(Team))}
        for batch in session.scalars(select(Batch)):
            issues = self._batch_issues(session, batch, accepted.get(batch.id), rows)
            for issue in issues:
                self.finding("batch inconsistencies").add(f"{batch.id} {issue}")
            team = teams.get(batch.team_id)
            if batch.status in TERMINAL_BATCH and team is not None and team.webhook_url:
                wanted = event_id(batch.id, f"batch.{batch.status}")
                if not any(d.webhook_id == wanted and d.answered < 300 and d.signature_ok
                           for d in deliveries):
                    self.finding("batch webhooks missing").add(f"{batch.id} batch.{batch.status}")

    def _batch_issues(self, session: Any, batch: Batch, outcome: Outcome | None,
                      rows: dict[str, Any]) -> list[str]:
        if batch.status not in TERMINAL_BATCH:
            return [f"not terminal: status={batch.status}"]
        if batch.status != "completed":
            return [f"ended {batch.status}: errors={batch.errors}"]
        issues = []
        line_ids = [c for (c,) in session.execute(
            select(BatchLine.custom_id).where(BatchLine.batch_id == batch.id))]
        if outcome is not None and batch.num_lines != outcome.lines:
            issues.append(f"num_lines={batch.num_lines}, uploaded {outcome.lines}")
        key = self.team_keys[batch.team_id]
        with httpx.Client(base_url=self.api_url, timeout=30,
                          headers={"Authorization": f"Bearer {key}"}) as client:
            counts = client.get(f"/v1/batches/{batch.id}").json().get("request_counts", {})
            output = _file_lines(client, batch.output_file_id)
            errors = _file_lines(client, batch.error_file_id)
        total = counts.get("total", 0)
        if counts.get("completed", 0) + counts.get("failed", 0) != total:
            issues.append(f"request_counts {counts}: completed+failed != total")
        if len(output) + len(errors) != len(line_ids):
            issues.append(f"output {len(output)} + error {len(errors)} lines != "
                          f"{len(line_ids)} input lines")
        custom_ids = [line.get("custom_id") for line in output + errors]
        duplicated = [c for c, n in Counter(custom_ids).items() if n > 1]
        if duplicated:
            issues.append(f"custom_ids more than once: {duplicated[:5]}")
        if set(custom_ids) != set(line_ids):
            issues.append(f"custom_ids missing {sorted(set(line_ids) - set(custom_ids))[:5]}, "
                          f"unknown {sorted(set(custom_ids) - set(line_ids))[:5]}")
        return issues

    def _leftovers(self, samples: int = 4, interval_s: float = 2.0) -> None:
        """Assignments, queued and unacknowledged messages present in every one of a few
        samples: the periodic tasks beat keeps sending come and go, leftovers stay."""
        client = redis.Redis.from_url(self.services.redis_url)
        seen: list[set[str]] = []
        try:
            for sample in range(samples):
                if sample:
                    time.sleep(interval_s)
                seen.append(self._redis_entries(client))
        finally:
            client.close()
        for entry in sorted(set.intersection(*seen)):
            kind, _, what = entry.partition(" ")
            name = "leftover assignments" if kind == "assigned" else "leftover queue messages"
            self.finding(name).add(what)

    def _redis_entries(self, client: redis.Redis) -> set[str]:
        entries = set()
        for instance_id in self.settings.instance_ids:
            for request_id in client.hkeys(f"blockq:instance:{instance_id}:assigned"):
                entries.add(f"assigned {instance_id}: {request_id.decode()}")
        queues = [*SERVICE_QUEUES, *self.settings.instance_ids]
        for queue, depths in queue_depths(client, queues).items():
            for step, depth in depths.items():
                # NOTE: a queue's messages have no stable id here: the oldest one's body is.
                oldest = client.lindex(queue if step == 0 else f"{queue}:{step}", -1) or b""
                entries.add(f"queued {queue}[{step}]: {depth} waiting, oldest "
                            f"{_task_name(oldest)}")
        for tag, message in client.hgetall("unacked").items():
            entries.add(f"unacked {tag.decode()}: {_task_name(message)}")
        return entries


def _task_name(message: bytes) -> str:
    """The Celery task name and id in a kombu message (or its start, if it is not one)."""
    try:
        payload = json.loads(message)
        if isinstance(payload, list):  # unacked entries: [message, exchange, routing_key]
            payload = payload[0]
        headers = payload.get("headers", {})
        return f"{headers.get('task')}[{headers.get('id')}] argsrepr={headers.get('argsrepr')}"
    except (ValueError, AttributeError, IndexError, TypeError):
        return message[:80].decode(errors="replace")


def _file_lines(client: httpx.Client, file_id: str | None) -> list[dict[str, Any]]:
    if not file_id:
        return []
    response = client.get(f"/v1/files/{file_id}/content")
    response.raise_for_status()
    return [json.loads(line) for line in response.text.splitlines() if line.strip()]


# --- recovery times ------------------------------------------------------------------------------


def stranded_recovery(db: Database, faults: list[Fault]
                      ) -> list[tuple[int, float | None, str | None]]:
    """Per fault: (requests in flight when it began, seconds from its end until the last of
    them that ever finished was terminal, that request's id); 0 s when all were terminal before
    the fault ended. A request that never finished (reported as lost) is left out of every
    fault's time and counted once, by the first fault after its creation: the time is None for
    that fault. Batch lines count from their release (their row's birth)."""
    with db.session() as session:
        spans = [(rid, created.timestamp(), None if finished is None else finished.timestamp(),
                  status)
                 for rid, created, finished, status in session.execute(
                     select(InferenceRequest.id, InferenceRequest.created_at,
                            InferenceRequest.finished_at, InferenceRequest.status))]
    starts = sorted(f.start for f in faults)
    blamed = {rid: next((t for t in starts if t > created), None)
              for rid, created, finished, status in spans
              if finished is None or status not in TERMINAL}
    result: list[tuple[int, float | None, str | None]] = []
    for fault in faults:
        stranded = [(rid, finished) for rid, created, finished, status in spans
                    if created < fault.start and (finished is None or finished > fault.start)]
        never = [rid for rid, t in blamed.items() if t == fault.start]
        done = [(rid, finished) for rid, finished in stranded
                if rid not in blamed and finished is not None]
        if never:
            result.append((len(stranded), None, never[0]))
        elif not done:
            result.append((len(stranded), 0.0, None))
        else:
            rid, last = max(done, key=lambda item: item[1])
            result.append((len(stranded), max(0.0, last - fault.end), rid))
    return result


# --- the run -------------------------------------------------------------------------------------


@dataclass
class RunConfig:
    requests: int = 5000
    faults_per_kind: int = 20
    kinds: list[str] | None = None  # None: every kind of fault_kinds()
    seed: int = 1
    instances: int = 2
    clients: int = 48
    #: Seconds of traffic; None: faults x seconds_per_fault.
    duration_s: float | None = None
    seconds_per_fault: float = 4.0
    crash_after_commit: float = 0.002  # probability per commit (0: not armed)
    webhook_fail_first: int = 2
    time_scale: float = 0.5
    heartbeat_ttl_s: float = 2.0
    sync_timeout_s: float = 90.0
    recover_timeout_s: float = 60.0
    settle_timeout_s: float = 300.0
    model_path: Path | None = None
    work_dir: Path | None = None  # None: a new temporary directory, removed after
    keep: bool = False  # keep the work directory (logs, databases) after the run


@dataclass
class RunResult:
    config: dict[str, Any]
    faults: list[dict[str, Any]]
    fault_summary: list[dict[str, Any]]
    findings: dict[str, dict[str, Any]]
    workload: dict[str, Any]
    exits: list[dict[str, Any]]
    settle: dict[str, Any]
    timings: dict[str, float]
    work_dir: str

    def violations(self) -> dict[str, dict[str, Any]]:
        """The invariants that failed, with their stories."""
        return {name: f for name, f in self.findings.items() if f["count"]}


def _settings(config: RunConfig, services: OwnServices, data_dir: Path) -> Settings:
    model_path = config.model_path or ROOT / ".blockq" / "models" / "tiny-llama"
    if not (model_path / "config.json").exists():
        raise SystemExit(f"tiny model missing at {model_path}: run scripts/setup.sh, or give "
                         "--model-path")
    return Settings(
        database_url=services.database_url, redis_url=services.redis_url, data_dir=data_dir,
        model_path=model_path, api_port=free_port(), flower_port=free_port(),
        webhook_secret=new_secret(), num_instances=config.instances,
        engine_kind="emulated", emulated_time_scale=config.time_scale,
        heartbeat_ttl_s=config.heartbeat_ttl_s, orphan_check_interval_s=1.0,
        webhook_backoff_s=0.2, engine_concurrency=96, kv_cache_gib=0.5,
        sync_timeout_s=config.sync_timeout_s, batch_release_interval_s=0.2,
        max_batch_in_flight=64, log_format="json",
    )


def _teams(settings: Settings, receiver_url: str) -> dict[str, tuple[str, str]]:
    """Two batch teams of different shares, with a batch webhook URL each;
    name -> (team id, key)."""
    db = Database(settings.resolved_database_url)
    keys = {}
    try:
        with db.session() as session:
            for name, share in (("chaos-a", 1), ("chaos-b", 2)):
                team = create_team(session, name, share=share, rate_limit_rpm=1_000_000,
                                   webhook_url=f"{receiver_url}/batches")
                keys[name] = (team.id, issue_key(session, team).key)
    finally:
        db.dispose()
    return keys


def _unfinished(db: Database) -> tuple[int, int]:
    """(requests not terminal, batches not terminal)."""
    with db.session() as session:
        requests = session.scalar(select(func.count()).select_from(InferenceRequest)
                                  .where(InferenceRequest.status.not_in(TERMINAL))) or 0
        batches = session.scalar(select(func.count()).select_from(Batch)
                                 .where(Batch.status.not_in(TERMINAL_BATCH))) or 0
    return requests, batches


def _webhooks_pending(db: Database, receiver: WebhookReceiver) -> int:
    """Events of terminal requests and batches not delivered yet (every batch team of the run
    has a webhook URL)."""
    delivered = {d.webhook_id for d in receiver.snapshot() if d.answered < 300}
    with db.session() as session:
        wanted = [event_id(rid, f"request.{status}") for rid, status in session.execute(
            select(InferenceRequest.id, InferenceRequest.status)
            .where(InferenceRequest.webhook_url.is_not(None),
                   InferenceRequest.status.in_(TERMINAL)))]
        wanted += [event_id(bid, f"batch.{status}") for bid, status in session.execute(
            select(Batch.id, Batch.status).join(Team, Team.id == Batch.team_id)
            .where(Team.webhook_url.is_not(None), Batch.status.in_(TERMINAL_BATCH)))]
    return sum(1 for w in wanted if w not in delivered)


def settle(db: Database, receiver: WebhookReceiver, timeout_s: float) -> dict[str, Any]:
    """Waits until every request and batch is terminal and every webhook delivered, or the
    timeout; what was left."""
    started = time.monotonic()
    left: tuple[int, int, int] = (-1, -1, -1)
    while time.monotonic() - started < timeout_s:
        try:
            requests, batches = _unfinished(db)
            left = (requests, batches, _webhooks_pending(db, receiver))
        except Exception:  # noqa: BLE001 - the database may still be coming back
            time.sleep(1)
            continue
        if left == (0, 0, 0):
            break
        time.sleep(1)
    return {"seconds": round(time.monotonic() - started, 1), "settled": left == (0, 0, 0),
            "requests_unfinished": left[0], "batches_unfinished": left[1],
            "webhooks_pending": left[2]}


def _percentile_summary(values: list[float]) -> tuple[float | None, float | None]:
    return (median(values), max(values)) if values else (None, None)


def summarize_faults(faults: list[Fault],
                     recovery: list[tuple[int, float | None, str | None]]
                     ) -> list[dict[str, Any]]:
    by_kind: dict[str, list[tuple[Fault, tuple[int, float | None]]]] = defaultdict(list)
    for fault, (n, t, _) in zip(faults, recovery, strict=True):
        by_kind[fault.kind].append((fault, (n, t)))
    summary = []
    for kind in sorted(by_kind):
        items = by_kind[kind]
        stranded = [r for _, r in items]
        times = [t for _, t in stranded if t is not None]
        back = [f.fleet_back_s for f, _ in items if f.fleet_back_s is not None]
        p50, worst = _percentile_summary(times)
        back_p50, back_max = _percentile_summary(back)
        summary.append({
            "kind": kind, "injected": len(items),
            "in_flight": sum(n for n, _ in stranded),
            "never_recovered": sum(1 for n, t in stranded if n and t is None),
            "recovery_p50_s": p50, "recovery_max_s": worst,
            "fleet_back_p50_s": back_p50, "fleet_back_max_s": back_max,
            "fleet_not_back": sum(1 for f, _ in items if f.fleet_back_s is None
                                  and f.kind != "crash-after-commit"),
        })
    return summary


def _schedule(kinds: list[str], per_kind: int, rng: random.Random) -> list[str]:
    schedule = [kind for kind in kinds for _ in range(per_kind)]
    rng.shuffle(schedule)
    return schedule


#: What app/faults.py logs just before it ends a process.
CRASH_AFTER_COMMIT_LINE = "fault point: exiting after a commit"


def _crash_faults(log_dir: Path) -> list[Fault]:
    """Every crash of the fault point, from the processes' JSON logs (a gunicorn worker's exit
    is not a process exit the watch sees: its master starts another)."""
    faults = []
    for path in sorted(log_dir.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if CRASH_AFTER_COMMIT_LINE not in line:
                continue
            try:
                at = datetime.fromisoformat(json.loads(line)["time"]).timestamp()
            except (ValueError, KeyError, TypeError):
                continue
            faults.append(Fault("crash-after-commit", path.stem, at, at))
    return faults


def _workload_summary(workload: Workload) -> dict[str, Any]:
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    for o in workload.outcomes:
        counts = by_kind[o.kind]
        counts["jobs"] += 1
        counts["requests"] += o.lines if o.kind == "batch" else 1
        counts["accepted"] += o.accepted
        counts["retried"] += o.tries > 1
        counts["interrupted"] += bool(o.interrupted)
        if o.note:
            counts[o.note.split(":")[0].split(" ")[0]] += 1
    return {"by_kind": {k: dict(v) for k, v in by_kind.items()},
            "answers": dict(workload.statuses),
            "interruptions": dict(Counter(o.interrupted for o in workload.outcomes
                                          if o.interrupted)),
            "client_errors": [o.note for o in workload.outcomes
                              if o.note and o.note.startswith(("client error", "refused"))][:10]}


@contextlib.contextmanager
def _work_dir(config: RunConfig) -> Iterator[Path]:
    if config.work_dir is not None:
        config.work_dir.mkdir(parents=True, exist_ok=True)
        yield config.work_dir
        return
    path = Path(tempfile.mkdtemp(prefix="blockq-chaos-"))
    path.chmod(0o755)  # PostgreSQL's user (when we are root) must reach its directory below
    try:
        yield path
    finally:
        if not config.keep:
            shutil.rmtree(path, ignore_errors=True)


def run(config: RunConfig, log: Callable[[str], None] = print) -> RunResult:
    """One chaos run, start to finish; everything it started is stopped when it returns."""
    with _work_dir(config) as work_dir:
        services = OwnServices(work_dir / "services")
        services.start()
        try:
            return _run_on(config, services, work_dir, log)
        finally:
            services.stop()


def _run_on(config: RunConfig, services: OwnServices, work_dir: Path,
            log: Callable[[str], None]) -> RunResult:
    timings: dict[str, float] = {}
    began = time.monotonic()
    upgrade(services.database_url)
    settings = _settings(config, services, work_dir / "data")
    kinds = config.kinds or fault_kinds(settings)
    unknown = set(kinds) - set(fault_kinds(settings))
    if unknown:
        raise SystemExit(f"unknown fault kinds {sorted(unknown)}; known: {fault_kinds(settings)}")
    rng = random.Random(config.seed)
    schedule = _schedule(kinds, config.faults_per_kind, rng)
    duration_s = config.duration_s or max(30.0, len(schedule) * config.seconds_per_fault)
    receiver = WebhookReceiver(settings.webhook_secret.get_secret_value(),  # type: ignore[union-attr]
                               config.webhook_fail_first)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKQ_")}
    env.update(settings.as_env())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if config.crash_after_commit > 0:
        env[CRASH_AFTER_COMMIT_ENV] = str(config.crash_after_commit)
    stack = Stack(settings, env=env)
    names = [n for n in process_commands(settings) if n != "flower"]
    db = Database(settings.resolved_database_url)
    watch: ProcessWatch | None = None
    try:
        stack.start(names=names)
        stack.wait_ready(num_instances=config.instances)
        timings["stack_ready_s"] = time.monotonic() - began
        stack.supervise()
        watch = ProcessWatch(stack)
        watch.start()
        teams = _teams(settings, receiver.url)
        team_keys = {name: key for name, (_, key) in teams.items()}
        log(f"stack up in {timings['stack_ready_s']:.0f} s ({', '.join(names)}); "
            f"{config.requests} requests over {duration_s:.0f} s, {len(schedule)} faults; "
            f"logs in {stack.log_dir}")
        deadline = time.monotonic() + duration_s + config.settle_timeout_s
        workload = Workload(stack, receiver, team_keys, config, deadline=deadline)
        injector = Injector(stack, services, watch, config, random.Random(rng.random()))
        stop_faults = threading.Event()
        start = time.monotonic() + 1.0
        fault_thread = threading.Thread(
            target=injector.run, args=(schedule, start, duration_s, stop_faults), daemon=True)
        fault_thread.start()
        workload.run(start, duration_s, random.Random(rng.random()))
        timings["traffic_s"] = time.monotonic() - start
        log(f"all {workload.submitted} requests answered; waiting for the last faults")
        fault_thread.join()
        timings["faults_s"] = time.monotonic() - start
        log("faults over; settling")
        settled = settle(db, receiver, config.settle_timeout_s)
        faults = injector.faults + _crash_faults(stack.log_dir)
        faults.sort(key=lambda f: f.start)
        recovery = stranded_recovery(db, faults)
        findings = Checker(db, services, settings, receiver, workload.outcomes,
                           dict(teams.values()), stack.api_url).run()
        workload.close()
        injector.close()
        timings["total_s"] = time.monotonic() - began
        exits = [asdict(e) for e in watch.exits]
        unexpected = [e for e in watch.exits if e.cause is None
                      and e.code != CRASH_AFTER_COMMIT_EXIT]
        finding = findings.setdefault("unexpected process exits",
                                      Finding("unexpected process exits"))
        for e in unexpected:
            at = time.strftime("%H:%M:%S", time.localtime(e.at))
            finding.add(f"{e.name} pid {e.pid} exit {e.code} at {at}: "
                        f"{_log_tail(stack.log_dir / (e.name + '.log'), e.at)}")
        return RunResult(
            config={k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
            faults=[{**f.to_json(), "in_flight": n, "recovery_s": t, "last_request": rid}
                    for f, (n, t, rid) in zip(faults, recovery, strict=True)],
            fault_summary=summarize_faults(faults, recovery),
            findings={name: asdict(f) for name, f in findings.items()},
            workload=_workload_summary(workload), exits=exits, settle=settled,
            timings={k: round(v, 1) for k, v in timings.items()}, work_dir=str(work_dir))
    finally:
        if watch is not None:
            watch.stop()
        stack.stop(timeout_s=20)
        db.dispose()
        receiver.close()


def _log_tail(path: Path, before: float) -> str:
    """The last error-looking line a process log got up to `before` (wall time): mostly why
    the process died. Lines that are not JSON (gunicorn's own, tracebacks) have no time."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines[-2000:]):
        if not any(w in line for w in ("Error", "error", "Unrecoverable", "in use", "Exit")):
            continue
        try:
            if datetime.fromisoformat(json.loads(line)["time"]).timestamp() > before:
                continue
        except (ValueError, KeyError, TypeError):
            pass
        return line.strip()[:300]
    return ""


# --- the report ----------------------------------------------------------------------------------


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def report(result: RunResult, console: Console) -> None:
    faults = Table(title="Faults (recovery: from the fault's end until every request in flight "
                   "at its start was terminal; fleet back: until every process ran, the API "
                   "was ready and every engine alive)")
    for column in ("fault", "injected", "in flight", "never recovered", "recovery p50 s",
                   "recovery max s", "fleet back p50 s", "fleet back max s", "fleet not back"):
        faults.add_column(column, justify="left" if column == "fault" else "right")
    for row in result.fault_summary:
        faults.add_row(row["kind"], str(row["injected"]), str(row["in_flight"]),
                       str(row["never_recovered"]), _seconds(row["recovery_p50_s"]),
                       _seconds(row["recovery_max_s"]), _seconds(row["fleet_back_p50_s"]),
                       _seconds(row["fleet_back_max_s"]), str(row["fleet_not_back"]))
    console.print(faults)

    work = Table(title="Workload (requests: batch lines count one each; retried: a client "
                 "needed more than one try)")
    for column in ("kind", "jobs", "requests", "accepted", "retried", "gave up",
                   "streams interrupted", "sync timeouts (504)", "failed"):
        work.add_column(column, justify="left" if column == "kind" else "right")
    for kind, counts in sorted(result.workload["by_kind"].items()):
        work.add_row(kind, str(counts.get("jobs", 0)), str(counts.get("requests", 0)),
                     str(counts.get("accepted", 0)), str(counts.get("retried", 0)),
                     str(counts.get("gave_up", 0)), str(counts.get("interrupted", 0)),
                     str(counts.get("timeout", 0)), str(counts.get("failed", 0)))
    console.print(work)
    console.print("API answers seen by clients (HTTP status or transport error): "
                  + ", ".join(f"{k}: {v}" for k, v in sorted(result.workload["answers"].items())))
    if result.workload["interruptions"]:
        console.print("Stream interruptions by cause: " + ", ".join(
            f"{k}: {v}" for k, v in result.workload["interruptions"].items()))

    checks = Table(title=f"Invariants after settling ({result.settle['seconds']} s, "
                   f"settled: {result.settle['settled']})")
    checks.add_column("invariant")
    checks.add_column("violations", justify="right")
    checks.add_column("examples")
    for name, finding in result.findings.items():
        style = "red" if finding["count"] else "green"
        checks.add_row(name, f"[{style}]{finding['count']}[/{style}]",
                       "\n".join(finding["examples"][:3]))
    console.print(checks)
    console.print(f"timings: {result.timings}; work dir: {result.work_dir}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--faults-per-kind", type=int, default=20)
    parser.add_argument("--kinds", help="comma-separated fault kinds (default: all; "
                        "`--list-kinds` shows them)")
    parser.add_argument("--list-kinds", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--clients", type=int, default=48, help="client threads")
    parser.add_argument("--duration", type=float, help="seconds of traffic (default: "
                        "faults x --seconds-per-fault)")
    parser.add_argument("--seconds-per-fault", type=float, default=4.0)
    parser.add_argument("--crash-after-commit", type=float, default=0.002,
                        help="probability per commit of the crash-after-commit fault point "
                        "(0: not armed)")
    parser.add_argument("--webhook-fail-first", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=0.5,
                        help="wall seconds per emulated second of the engines")
    parser.add_argument("--settle-timeout", type=float, default=300.0)
    parser.add_argument("--recover-timeout", type=float, default=60.0)
    parser.add_argument("--model-path", type=Path)
    parser.add_argument("--work-dir", type=Path, help="keep everything here (default: a "
                        "temporary directory, removed after)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--json", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    config = RunConfig(
        requests=args.requests, faults_per_kind=args.faults_per_kind,
        kinds=args.kinds.split(",") if args.kinds else None, seed=args.seed,
        instances=args.instances, clients=args.clients, duration_s=args.duration,
        seconds_per_fault=args.seconds_per_fault, crash_after_commit=args.crash_after_commit,
        webhook_fail_first=args.webhook_fail_first, time_scale=args.time_scale,
        settle_timeout_s=args.settle_timeout, recover_timeout_s=args.recover_timeout,
        model_path=args.model_path, work_dir=args.work_dir, keep=args.keep)
    if args.list_kinds:
        settings = Settings(num_instances=args.instances, engine_kind="emulated")
        print("\n".join(fault_kinds(settings)))
        return 0
    console = Console(width=200)
    result = run(config, log=lambda message: console.log(message))
    report(result, console)
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=1, default=str))
    return 1 if result.violations() else 0


if __name__ == "__main__":
    sys.exit(main())
