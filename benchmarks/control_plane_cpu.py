"""CPU per request of the control plane on emulated engines (issue 14, item 6): no GPU, no vLLM.

Starts the local stack (API, predict, route, webhooks, beat, health, batches, Flower) with
`--instances` emulated engines (engine_kind "emulated": each engine a simulated vLLM instance in
a Celery worker of its own), the learned length predictor and the configured policy, then sends
real ShareGPT prompts at a fixed Poisson rate through the API and measures, per role, the CPU
seconds (user + system, psutil) its processes spent over the load window, divided by the
requests that completed in it: the same accounting as scripts/bench_control_plane.py
(`CpuMeter`), with the idle rate of each role (a quiet window first) subtracted for the net
figure. The engines' own workers are reported apart (they are not the control plane). Also
the time from the API accepting a request (its row's `created_at`) to an engine admitting it
(`started_at`), p50/p99, with its stages, from the requests' timestamps.

    .venv/bin/python scripts/bench_control_plane_cpu.py --rate 5 --duration-s 60

CPU time is meaningful on a loaded machine (a process's CPU seconds are its own); wall
latencies are not, and are not reported. `--profile ROLE` attaches py-spy (when installed) to
that role's processes for the load window and writes a flame graph per process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from app.cli.stack import free_port, stop_stacks_on_sigterm
from benchmarks.control_plane import (
    PG_BACKENDS,
    PG_SHARED,
    REDIS,
    ROLES,
    CpuMeter,
    stage_latencies,
)
from benchmarks.local import add_service_arguments, bench_stack, fresh_services
from benchmarks.paths import DATA_DIR, TINY_MODEL
from domain.settings import Settings

DEFAULT_PROMPTS = (DATA_DIR / "conversations" / "sharegpt"
                   / "ShareGPT_V3_filtered_1000.json")
ENGINES = "emulated engines"
CONTROL_PLANE = "control plane (API, workers, beat, Flower, PG backends)"


def load_prompts(path: Path, limit: int, seed: int) -> list[str]:
    """First human turns of the ShareGPT file, shuffled by `seed`, cut to 2,000 characters."""
    rows = json.loads(path.read_text())
    prompts = [c["value"][:2000] for row in rows for c in row.get("conversations", [])[:1]
               if c.get("from") == "human" and c.get("value", "").strip()]
    random.Random(seed).shuffle(prompts)
    return prompts[:limit]


def settings_of(args: argparse.Namespace, data_dir: Path) -> Settings:
    return Settings(
        database_url=args.database_url, redis_url=args.redis_url, data_dir=data_dir,
        model_path=args.model_path, api_port=free_port(), flower_port=free_port(),
        num_instances=args.instances, engine_kind="emulated", emulated_time_scale=1.0,
        emulated_output_lengths="max_tokens", length_predictor=args.predictor,
        routing_policy=args.policy, route_in_predict=True, route_in_api=not args.predict_task,
        max_model_len=2048,
        learn_retrain_interval_s=0, learn_refit_interval_s=0,
        held_connections_team_caps={"local": 256}, log_format="text")


async def send(base_url: str, api_key: str, prompts: list[str], rate: float, endpoint: str,
               max_tokens: int, seed: int) -> dict[int | str, int]:
    """Poisson arrivals at `rate`; each request waits for its answer (held completions) or only
    for its 202 (native requests). Returns status code -> count."""
    rng = random.Random(seed)
    arrivals, at = [], 0.0
    for _ in prompts:
        at += rng.expovariate(rate)
        arrivals.append(at)
    codes: dict[int | str, int] = {}
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=128)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=300,
                                 headers={"Authorization": f"Bearer {api_key}"}) as client:
        start = time.perf_counter()

        async def one(prompt: str, due: float) -> None:
            await asyncio.sleep(max(0.0, start + due - time.perf_counter()))
            body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens,
                                    "temperature": 0}
            if endpoint == "completions":
                body["model"] = "tiny-llama"
            path = "/v1/completions" if endpoint == "completions" else "/v1/requests"
            try:
                code: int | str = (await client.post(path, json=body)).status_code
            except httpx.HTTPError as error:  # counted by its kind, e.g. "ReadTimeout"
                code = type(error).__name__
            codes[code] = codes.get(code, 0) + 1

        await asyncio.gather(*(one(p, d) for p, d in zip(prompts, arrivals, strict=True)))
    return codes


def wait_done(database_url: str, expected: int, timeout_s: float) -> int:
    """Until `expected` requests are terminal (native requests answer before they run)."""
    engine = sa.create_engine(database_url)
    deadline = time.time() + timeout_s
    done = 0
    try:
        while time.time() < deadline:
            with engine.connect() as conn:
                done = conn.execute(sa.text(
                    "SELECT count(*) FROM requests WHERE status IN "
                    "('succeeded', 'failed', 'cancelled', 'rejected')")).scalar_one()
            if done >= expected:
                break
            time.sleep(0.5)
    finally:
        engine.dispose()
    return int(done)


_DB_STATS = sa.text("SELECT xact_commit + xact_rollback, tup_inserted + tup_updated + "
                    "tup_deleted FROM pg_stat_database WHERE datname = current_database()")


def db_stats(database_url: str) -> tuple[int, int]:
    """Transactions (committed or rolled back) and rows written so far in this database
    (PostgreSQL's statistics: they lag their backends by up to half a second)."""
    engine = sa.create_engine(database_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            row = conn.execute(_DB_STATS).one()
            return int(row[0]), int(row[1])
    finally:
        engine.dispose()


def latencies(database_url: str, start: datetime, end: datetime
              ) -> dict[str, tuple[float, float, int]]:
    """Accept -> admit and its stages (ms) of the requests accepted in [start, end]:
    stage -> (p50, p99, count)."""
    engine = sa.create_engine(database_url, poolclass=sa.pool.NullPool)
    try:
        return stage_latencies(engine, start, end)
    finally:
        engine.dispose()


def profile(pids: list[int], seconds: float, out_dir: Path, *,
            native: bool = False) -> list[subprocess.Popen[bytes]]:
    """py-spy on each process: its Python threads while they hold the GIL, or (`native`) every
    thread on the CPU, with the native frames (libpq, the tokenizers, numpy) that run without
    the GIL."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    mode = ["--native"] if native else ["--nonblocking", "--gil"]
    return [subprocess.Popen(
        [spy, "record", *mode, "-r", "250", "-p", str(pid), "-d", str(int(seconds)),
         "-f", "raw", "-o", str(out_dir / f"profile-{pid}.txt")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for pid in pids]


def thread_cpu(pid: int) -> dict[tuple[int, int], tuple[float, float]]:
    """CPU seconds so far, (user, system), of each thread of a process and of its children
    ((process id, native thread id) -> seconds): an API's threads live in gunicorn's workers."""
    import psutil  # noqa: PLC0415

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {}
    spent = {}
    for process in processes:
        try:
            spent.update({(process.pid, t.id): (t.user_time, t.system_time)
                          for t in process.threads()})
        except psutil.Error:
            continue
    return spent


def print_threads(role: str, pid: int, before: dict[tuple[int, int], tuple[float, float]],
                  requests: int) -> None:
    """The busiest threads of `role`'s processes since `before`, user and system CPU apart."""
    spent = thread_cpu(pid)
    names = {(p, tid): name for p in {p for p, _ in spent}
             for tid, name in thread_names(p).items()}
    rows = sorted((((u - before.get(key, (0.0, 0.0))[0]), (k - before.get(key, (0.0, 0.0))[1]),
                    key) for key, (u, k) in spent.items()),
                  key=lambda row: row[0] + row[1], reverse=True)
    per_request = 1000 / max(requests, 1)
    print(f"\nthreads of {role} (ms of CPU per completed request: user, system):")
    for user, system, key in rows[:12]:
        print(f"  {key[0]:7d} {key[1]:8d} {names.get(key, '?'):32s} "
              f"{user * per_request:7.2f} {system * per_request:7.2f}")


def thread_names(pid: int) -> dict[int, str]:
    """Native thread id -> Python thread name, from `py-spy dump` (empty without py-spy)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    try:
        dump = subprocess.run([spy, "dump", "--nonblocking", "-p", str(pid)],
                              capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    names = {}
    for line in dump.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "Thread":
            tid = words[1]
            try:
                names[int(tid, 16) if tid.startswith("0x") else int(tid)] = words[-1].strip('"')
            except ValueError:
                continue
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=5.0, help="requests per second")
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--idle-s", type=float, default=15.0)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--endpoint", choices=("completions", "requests"), default="completions")
    parser.add_argument("--policy", default="block")
    parser.add_argument("--predictor", default="learned")
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-path", type=Path,
                        default=TINY_MODEL)
    add_service_arguments(parser)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--route-in-api", action="store_true",
                       help="the API predicts and routes held completions (route_in_api: the "
                       "default)")
    where.add_argument("--predict-task", action="store_true",
                       help="predict and route in the predict task (route_in_api off)")
    parser.add_argument("--profile", default=None, help="stack process name to py-spy")
    parser.add_argument("--profile-dir", type=Path, default=Path("."))
    parser.add_argument("--profile-native", action="store_true",
                        help="profile every thread on the CPU with its native frames (pauses "
                        "the process at each sample: its CPU figures are not comparable)")
    parser.add_argument("--threads-of", default=None,
                        help="stack process name whose threads' CPU to report")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    stop_stacks_on_sigterm()

    count = max(1, round(args.rate * args.duration_s))
    prompts = load_prompts(args.prompts, count + 8, args.seed)
    warmup, prompts = prompts[:8], prompts[8:]
    database = sa.engine.make_url(args.database_url).database or ""
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="blockq-cp-cpu-") as tmp:
        settings = settings_of(args, Path(tmp))
        fresh_services(args.database_url, args.redis_url)
        stack = bench_stack(settings)
        try:
            stack.start()
            stack.wait_ready(num_instances=args.instances, timeout_s=900)
            stack.wait_workers_ready(900)
            assert stack.api_key is not None
            roots = {ROLES.get(name, ENGINES): p.pid for name, p in stack.processes.items()}
            meter = CpuMeter(roots, database)
            asyncio.run(send(stack.api_url, stack.api_key, warmup, 4.0, args.endpoint,
                             args.max_tokens, args.seed + 1))
            wait_done(args.database_url, len(warmup), 120)
            time.sleep(1.0)  # the statistics collector catches up
            stats_idle = db_stats(args.database_url)
            before = meter.snapshot()
            time.sleep(args.idle_s)
            after = meter.snapshot()
            stats_idle_after = db_stats(args.database_url)
            idle_window = after.at - before.at
            idle = {r: s / (after.at - before.at)
                    for r, s in CpuMeter.delta(before, after).items()}
            spies = []
            threads_before = (thread_cpu(stack.processes[args.threads_of].pid)
                              if args.threads_of else {})
            if args.profile:
                pid = stack.processes[args.profile].pid
                import psutil  # noqa: PLC0415

                pids = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
                spies = profile(pids, args.duration_s + 5, args.profile_dir,
                                native=args.profile_native)
            print(f"sending {len(prompts)} requests at {args.rate} req/s", flush=True)
            stats_before = db_stats(args.database_url)
            load_started = datetime.now(UTC)
            before = meter.snapshot()
            codes = asyncio.run(send(stack.api_url, stack.api_key, prompts, args.rate,
                                     args.endpoint, args.max_tokens, args.seed))
            accepted = codes.get(200, 0) + codes.get(202, 0)
            done = wait_done(args.database_url, len(warmup) + accepted, 300) - len(warmup)
            after = meter.snapshot()
            time.sleep(1.0)
            stats_after = db_stats(args.database_url)
            stages = latencies(args.database_url, load_started, datetime.now(UTC))
            if args.threads_of:
                print_threads(args.threads_of, stack.processes[args.threads_of].pid,
                              threads_before, len(prompts))
            for spy in spies:
                spy.wait()
        finally:
            stack.stop(timeout_s=20)
    window = after.at - before.at
    cpu = CpuMeter.delta(before, after)
    control = [*ROLES.values(), PG_BACKENDS]
    cpu[CONTROL_PLANE] = sum(cpu.get(r, 0.0) for r in control)
    idle[CONTROL_PLANE] = sum(idle.get(r, 0.0) for r in control)
    rows = {}
    # Database work per request, less the idle rate (beat's periodic tasks) over the window.
    idle_rate = [(b - a) / idle_window for a, b in zip(stats_idle, stats_idle_after,
                                                        strict=True)]
    per_request = [(b - a - r * window) / max(done, 1)
                   for a, b, r in zip(stats_before, stats_after, idle_rate, strict=True)]
    print(f"\ndatabase per request (net of idle): {per_request[0]:.2f} transactions, "
          f"{per_request[1]:.2f} rows written")
    print(f"status codes {codes}; {done} completed in a {window:.1f} s window; load average "
          f"before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}")
    for name, (p50, p99, n) in stages.items():
        print(f"{name:20s} p50 {p50:8.1f} ms  p99 {p99:8.1f} ms  (n {n})")
    print(f"{'role':58s} {'idle ms/s':>9s} {'gross ms/req':>12s} {'net ms/req':>10s}")
    for role in [*ROLES.values(), PG_BACKENDS, PG_SHARED, REDIS, CONTROL_PLANE, ENGINES]:
        if role not in cpu:
            continue
        gross = cpu[role] / max(done, 1) * 1000
        net = (cpu[role] - idle.get(role, 0.0) * window) / max(done, 1) * 1000
        rows[role] = {"idle_ms_per_s": idle.get(role, 0.0) * 1000, "gross_ms": gross,
                      "net_ms": net}
        print(f"{role:58s} {idle.get(role, 0.0) * 1000:9.1f} {gross:12.1f} {net:10.1f}")
    if args.json:
        args.json.write_text(json.dumps({
            "args": {k: str(v) for k, v in vars(args).items()}, "codes": codes, "done": done,
            "window_s": window, "load_before": load_before, "load_after": os.getloadavg(),
            "db_per_request": {"transactions": per_request[0], "rows_written": per_request[1]},
            "latency_ms": {name: {"p50": p50, "p99": p99, "n": n}
                           for name, (p50, p99, n) in stages.items()},
            "roles": rows}, indent=1))
    return 0
