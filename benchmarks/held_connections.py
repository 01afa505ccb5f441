"""How many held connections one API process takes, and what each costs (issue 30, item 1).

Starts the API alone under gunicorn as `blockq serve` runs it (the gevent worker), with one
worker and no Celery worker: a completion is accepted and stays queued, so its connection stays
held. Opens N streamed chat completions on raw sockets, at once, and reports, once all are held
(their team slots counted in Redis):

  - the worker's resident memory before and with the N streams, and the difference per stream;
  - the Redis connections the API holds (the stream hub's reader and the shared pool, not one
    per stream);
  - whether /healthz still answers, and in how long (one call, so a figure of this run only);
  - how many were refused (an error status: 503 or 429), of the burst's team (its
    cap is N: none should be) and of another team whose `--other` streams open in the middle
    of the burst (issue 44: a burst within its cap once refused a third of itself and 4 of 20
    of another team, as a broker outage).

Memory is the process's own (psutil RSS); the time to open them all depends on the machine's
load, so the run holds the test services' lock and waits for a quiet machine
(`benchmarks.quiet.alone`), and prints the load average at the start and the end.

    .venv/bin/python scripts/bench_held_connections.py --streams 2000 --other 20
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import redis

from app.api.held_connections import held_slots
from app.cli.stack import free_port, process_commands, stop_stacks_on_sigterm
from benchmarks.local import fresh_services
from benchmarks.paths import ROOT, TINY_MODEL
from benchmarks.quiet import alone
from domain.db import Database
from domain.settings import Settings
from domain.teams import ensure_team_key

TEAM = "bench"
OTHER_TEAM = "bench-other"
CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4, "stream": True}


def open_stream(port: int, key: str) -> socket.socket:
    """A raw client that sends a streamed completion and reads nothing yet."""
    payload = json.dumps(CHAT).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 + f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n".encode()
                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


def wait_until(check: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


def refused(sock: socket.socket) -> bool:
    """Whether the API answered the stream with an error status (503, 429): a held chat stream
    answers 200 and its first event (the assistant's role) at once."""
    sock.setblocking(False)
    try:
        head = sock.recv(12, socket.MSG_PEEK)
    except BlockingIOError:
        return False
    finally:
        sock.setblocking(True)
    return head.startswith(b"HTTP/1.1 ") and len(head) == 12 and not head.endswith(b"200")


def worker_of(master: psutil.Process) -> psutil.Process:
    (worker,) = master.children()
    return worker


def redis_clients(client: redis.Redis, db: int) -> int:
    return sum(1 for c in client.client_list() if int(c.get("db", -1)) == db)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--other", type=int, default=20,
                        help="Streams of another team, opened halfway through the burst.")
    parser.add_argument("--model-path", type=Path,
                        default=TINY_MODEL)
    parser.add_argument("--database-url",
                        default="postgresql+psycopg://postgres@127.0.0.1:5432/blockq_bench_held")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    args = parser.parse_args()
    stop_stacks_on_sigterm()  # SIGTERM runs the `finally` that stops the API
    with alone():
        rows = _measure(args)
    print("\n| measure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    return 0


def _measure(args: argparse.Namespace) -> list[tuple[str, str]]:
    fresh_services(args.database_url, args.redis_url)
    with tempfile.TemporaryDirectory(prefix="blockq-bench-held-") as tmp:
        settings = Settings(
            database_url=args.database_url, redis_url=args.redis_url, data_dir=Path(tmp),
            model_path=args.model_path, api_port=free_port(), flower_port=free_port(),
            api_workers=1, held_connections_team_caps={TEAM: args.streams,
                                                       OTHER_TEAM: max(args.other, 1)},
            sync_timeout_s=3600.0, log_format="text")
        db = Database(settings.resolved_database_url)
        with db.session() as session:
            team = ensure_team_key(session, TEAM, rate_limit_rpm=10 * args.streams)
            key, team_id = team.key, team.team_id
            other = ensure_team_key(session, OTHER_TEAM, rate_limit_rpm=10 * args.streams)
        db.dispose()
        url = f"http://127.0.0.1:{settings.api_port}"
        with (Path(tmp) / "api.log").open("wb") as log:
            master = subprocess.Popen(process_commands(settings)["api"], cwd=ROOT, stdout=log,
                                      stderr=subprocess.STDOUT,
                                      env={**os.environ, **settings.as_env()})
        observer = redis.Redis.from_url(args.redis_url)
        db_number = int(observer.connection_pool.connection_kwargs["db"])
        try:
            if not wait_until(lambda: _healthy(url), 120):
                raise SystemExit(f"the API did not start; see {tmp}/api.log")
            worker = worker_of(psutil.Process(master.pid))
            rss_before = worker.memory_info().rss
            clients_before = redis_clients(observer, db_number)
            started = time.monotonic()
            half = args.streams // 2
            streams = [open_stream(settings.api_port, key) for _ in range(half)]
            others = [open_stream(settings.api_port, other.key) for _ in range(args.other)]
            streams += [open_stream(settings.api_port, key) for _ in range(args.streams - half)]
            held = wait_until(lambda: held_slots(observer, team_id) + sum(map(refused, streams))
                              >= args.streams, 600)
            wait_until(lambda: held_slots(observer, other.team_id) + sum(map(refused, others))
                       >= args.other, 60)
            took = time.monotonic() - started
            rss_with = worker.memory_info().rss
            clients_with = redis_clients(observer, db_number)
            t0 = time.monotonic()
            healthz = httpx.get(f"{url}/healthz", timeout=30).status_code
            healthz_ms = (time.monotonic() - t0) * 1000
            rows = [
                ("streams held at once (team slots in Redis)",
                 f"{held_slots(observer, team_id)} of {args.streams}"
                 + ("" if held else " (not all within 600 s)")),
                ("time to open and hold them all", f"{took:.1f} s"),
                ("worker RSS before / with them", f"{rss_before / 2**20:.1f} MiB / "
                                                  f"{rss_with / 2**20:.1f} MiB"),
                ("memory per held stream",
                 f"{(rss_with - rss_before) / args.streams / 1024:.1f} KiB"),
                ("API Redis connections before / with them", f"{clients_before} / {clients_with}"),
                ("/healthz while they are held", f"{healthz} in {healthz_ms:.0f} ms"),
                ("refused of the burst's team (cap = streams)",
                 f"{sum(map(refused, streams))} of {args.streams}"),
                ("refused of the other team (opened mid-burst)",
                 f"{sum(map(refused, others))} of {args.other}"),
            ]
            for sock in (*streams, *others):
                sock.close()
            wait_until(lambda: held_slots(observer, team_id) == 0, 300)
            rows.append(("streams held after the clients left", str(held_slots(observer, team_id))))
        finally:
            master.terminate()
            master.wait(timeout=30)
    return rows


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
