"""The control plane's cost, as a user feels it and as an operator pays for it (issues 14 and 30).

One run, one machine, the same tiny model on one real vLLM engine, two servers:
  - vLLM's own OpenAI server (`python -m vllm.entrypoints.openai.api_server`, 127.0.0.1 only),
  - blockq: the whole local stack (API, predict, route, webhooks, beat, health, batches, Flower,
    one vLLM engine worker) with the learned length predictor and the configured policy.
Each is loaded by vLLM's own benchmark client (`vllm bench serve`, random 128-token prompts,
64 output tokens, ignore_eos) with issue 30's loads: 200 prompts at 8 req/s, 400 at 48
concurrent, 512 at 256 concurrent (blockq's team allowed 1,024 held connections); the servers run
one after the other, never side by side. The run takes the test services' lock and the measuring
flag (`benchmarks.quiet`), waits for a quiet machine, and prints the load average at its start
and end. For blockq the run also measures

  1. CPU seconds per request of every non-engine process, by role (psutil cpu_times deltas over
     each load window, divided by the requests completed in it): the API (gunicorn, all workers),
     the Celery workers, beat, Flower, this database's PostgreSQL backends, redis-server. The
     idle rate of each role (a quiet window before the load) is given too, and the per-request
     cost net of it. PostgreSQL's shared processes and redis-server serve every database of the
     machine: on a shared machine their lines are upper bounds.
  2. The time from the API accepting a request (`requests.created_at`, the row's insert) to the
     engine admitting it (`started_at`, written by the engine worker as it takes the request,
     right before the engine's add_request), p50/p99, with its stages (-> predicted_at ->
     routed_at -> started_at), at low, moderate and saturating load; with the predict worker
     sharing the cores, and pinned to a core of its own (every other stack process on the
     remaining cores; PostgreSQL and Redis unpinned).

    .venv/bin/python scripts/bench_control_plane.py                     # the full run
    .venv/bin/python scripts/bench_control_plane.py --smoke             # a quick check

Results are printed as one table and, with --write-doc, written to docs/benchmarks_control_plane.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import sqlalchemy as sa

from app.cli.stack import LOCAL_TEAM, Stack, free_port, stop_stacks_on_sigterm
from benchmarks import quiet
from benchmarks.local import add_service_arguments, bench_stack, fresh_services
from benchmarks.paths import TINY_MODEL
from benchmarks.tables import fmt
from domain.settings import Settings
from workers.predict.length_model import head_artifact
from workers.serve.vllm_cli import vllm_cli

INPUT_LEN = 128
OUTPUT_LEN = 64
MODEL_NAME = "tiny-llama"
#: Issue 30's two concurrent loads: the engine's max_num_seqs, and far beyond it.
SATURATION_CONCURRENCY = 48
MANY_CONCURRENT = 256
#: The 1-minute load average above which a run counts as taken on a loaded machine.
QUIET_LOAD = 2.5
#: Held connections blockq's team may have open: more than the largest load holds.
TEAM_HELD_CAP = 1024

#: Stack process -> role in the table (the engine worker is the engine, not the control plane).
ROLES = {
    "api": "API (gunicorn)",
    "predict": "predict worker",
    "predict_bulk": "predict_bulk worker",
    "route": "route worker",
    "webhooks": "webhooks worker",
    "beat": "beat",
    "health": "health worker",
    "batches": "batches worker",
    "flower": "Flower",
}
PG_BACKENDS = "PostgreSQL backends (this db)"
PG_SHARED = "PostgreSQL shared processes*"
REDIS = "redis-server*"
ENGINE_WORKER = "engine worker (vLLM in-process)"
CONTROL_PLANE = "control plane total (with this db's PostgreSQL backends)"
#: The figure issue 30 judges: every blockq process but the engine worker.
BLOCKQ_PROCESSES = "blockq processes (engine worker, PostgreSQL, Redis left out)"




# --- CPU accounting -----------------------------------------------------------------------------
def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _cpu_s(process: psutil.Process) -> float | None:
    try:
        times = process.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return times.user + times.system


@dataclass
class CpuSnapshot:
    """CPU seconds so far of each process, by role: (role, pid) -> seconds."""

    at: float
    seconds: dict[tuple[str, int], float] = field(default_factory=dict)


class CpuMeter:
    """Snapshots the CPU time of each role's processes; deltas between two snapshots."""

    def __init__(self, roots: dict[str, int], database: str) -> None:
        self.roots = roots  # role -> root pid (its children count too)
        self.database = database

    def _processes(self) -> Iterator[tuple[str, psutil.Process]]:
        for role, pid in self.roots.items():
            for process in _tree(pid):
                yield role, process
        for process in psutil.process_iter(["name", "cmdline"]):
            name = process.info["name"] or ""
            title = " ".join(process.info["cmdline"] or ())
            if name.startswith("redis-server") or title.startswith("redis-server"):
                yield REDIS, process
            elif name == "postgres" or title.startswith(("postgres", "/usr/lib/postgresql")):
                words = title.split()
                if not _is_backend(words):
                    yield PG_SHARED, process
                elif self.database in words:
                    yield PG_BACKENDS, process

    def snapshot(self) -> CpuSnapshot:
        snap = CpuSnapshot(time.monotonic())
        for role, process in self._processes():
            seconds = _cpu_s(process)
            if seconds is not None:
                snap.seconds[(role, process.pid)] = seconds
        return snap

    @staticmethod
    def delta(before: CpuSnapshot, after: CpuSnapshot) -> dict[str, float]:
        """CPU seconds per role between the snapshots; a process that appeared counts from 0
        (a PostgreSQL backend that connected), one that ended is lost (not counted)."""
        roles: dict[str, float] = {}
        for key, seconds in after.seconds.items():
            roles[key[0]] = roles.get(key[0], 0.0) + seconds - before.seconds.get(key, 0.0)
        return roles


def _is_backend(words: list[str]) -> bool:
    """A client's backend: "postgres: [cluster:] user database host(port) state"."""
    return any(w.endswith(")") and "(" in w for w in words[1:])


# --- pinning --------------------------------------------------------------------------------------
def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of the process tree onto `cpus` (sched_setaffinity is per thread)."""
    for process in _tree(pid):
        try:
            threads = [t.id for t in process.threads()]
        except psutil.NoSuchProcess:
            continue
        for tid in threads:
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                os.sched_setaffinity(tid, cpus)


def _pin_stack(stack: Stack, *, predict_alone: bool) -> str:
    cpus = sorted(os.sched_getaffinity(0))
    if not predict_alone or len(cpus) < 2:
        for process in stack.processes.values():
            _pin(process.pid, set(cpus))
        return f"shared ({len(cpus)} cores)"
    own, rest = {cpus[-1]}, set(cpus[:-1])
    for name, process in stack.processes.items():
        _pin(process.pid, own if name == "predict" else rest)
    return f"predict pinned to core {cpus[-1]}, the stack on {sorted(rest)}"


# --- vLLM's benchmark client ----------------------------------------------------------------------
def bench_serve(base_url: str, model_path: Path, out_dir: Path, label: str, *, num_prompts: int,
                rate: float | None, concurrency: int | None, api_key: str | None,
                seed: int) -> dict[str, Any]:
    """`vllm bench serve` on /v1/completions (random prompts); its saved result."""
    result = out_dir / f"{label}.json"
    command = [
        *vllm_cli(), "bench", "serve", "--backend", "openai", "--base-url", base_url,
        "--endpoint", "/v1/completions", "--model", MODEL_NAME, "--tokenizer", str(model_path),
        "--dataset-name", "random", "--random-input-len", str(INPUT_LEN),
        "--random-output-len", str(OUTPUT_LEN), "--num-prompts", str(num_prompts),
        "--ignore-eos", "--seed", str(seed), "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,99",
        "--save-result", "--save-detailed", "--result-dir", str(out_dir),
        "--result-filename", result.name,
    ]
    command += ["--request-rate", str(rate) if rate is not None else "inf"]
    if concurrency is not None:
        command += ["--max-concurrency", str(concurrency)]
    env = {**os.environ, "OPENAI_API_KEY": api_key or "none"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800,
                          check=False)
    if done.returncode != 0 or not result.exists():
        raise RuntimeError(f"vllm bench serve ({label}) failed:\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-3000:]}")
    saved = json.loads(result.read_text())
    if saved.get("failed"):
        errors = [e for e in saved.get("errors", []) if e][:3]
        print(f"  {label}: {saved['failed']} failed requests, e.g. {errors}", flush=True)
    return saved


@dataclass(frozen=True)
class Load:
    label: str
    num_prompts: int
    rate: float | None  # requests/s; None: as fast as possible
    concurrency: int | None


@dataclass
class Phase:
    server: str  # "vllm" or "blockq"
    placement: str
    load: Load
    started: datetime
    ended: datetime
    result: dict[str, Any]
    cpu: dict[str, float]  # role -> CPU seconds over the window
    window_s: float
    #: The 1-minute load average at the phase's start and end: a point taken above 2.5 is
    #: rerun (a saturating phase raises the next one's start).
    loads: tuple[float, float] = (0.0, 0.0)
    latency: dict[str, tuple[float, float, int]] = field(default_factory=dict)


def _run_phase(server: str, placement: str, load: Load, base_url: str, args: argparse.Namespace,
               meter: CpuMeter, out_dir: Path, api_key: str | None) -> Phase:
    print(f"- {server} / {placement} / {load.label}", flush=True)
    # Every point, saturating ones included, starts on a quiet machine: not in the wake of the
    # point before (a point taken above 2.5 is not quoted).
    quiet.wait_for_quiet(args.quiet_load)
    started = datetime.now(UTC)
    load_at_start = os.getloadavg()[0]
    before = meter.snapshot()
    result = bench_serve(base_url, args.model_path, out_dir,
                         _slug(f"{server}-{placement.split()[0]}-{load.label}"),
                         num_prompts=load.num_prompts, rate=load.rate,
                         concurrency=load.concurrency, api_key=api_key, seed=args.seed)
    after = meter.snapshot()
    return Phase(server, placement, load, started, datetime.now(UTC), result,
                 CpuMeter.delta(before, after), after.at - before.at,
                 loads=(load_at_start, os.getloadavg()[0]))


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "_" for c in text)


def _idle(meter: CpuMeter, seconds: float) -> dict[str, float]:
    """CPU seconds per second of each role while nothing is sent."""
    before = meter.snapshot()
    time.sleep(seconds)
    after = meter.snapshot()
    return {role: s / (after.at - before.at) for role, s in CpuMeter.delta(before, after).items()}


# --- accept -> admit, from the database -----------------------------------------------------------
STAGES_SQL = sa.text("""
    SELECT extract(epoch FROM started_at - created_at) * 1000,
           extract(epoch FROM predicted_at - created_at) * 1000,
           extract(epoch FROM routed_at - predicted_at) * 1000,
           extract(epoch FROM started_at - routed_at) * 1000
    FROM requests
    WHERE created_at >= :start AND created_at <= :end AND started_at IS NOT NULL
""")

LATENCY_COLUMNS = ("accept->admit", "accept->predicted", "predicted->routed", "routed->admit")


def _latencies(engine: sa.Engine, phase: Phase) -> dict[str, tuple[float, float, int]]:
    return stage_latencies(engine, phase.started, phase.ended)


def stage_latencies(engine: sa.Engine, start: Any, end: Any) -> dict[str, tuple[float, float, int]]:
    """Accept -> admit and its stages (ms) of the requests accepted in [start, end]:
    stage -> (p50, p99, count)."""
    with engine.connect() as conn:
        rows = conn.execute(STAGES_SQL, {"start": start, "end": end}).all()
    out = {}
    for i, name in enumerate(LATENCY_COLUMNS):
        values = [float(r[i]) for r in rows if r[i] is not None]
        if values:
            out[name] = (float(np.percentile(values, 50)), float(np.percentile(values, 99)),
                         len(values))
    return out


# --- the two servers ------------------------------------------------------------------------------
def _engine_args(settings: Settings) -> list[str]:
    """vLLM's server with the engine blockq's worker builds (workers/serve/vllm_engine.py)."""
    return [
        "--max-num-seqs", "48", "--max-num-batched-tokens", "512", "--max-model-len", "2048",
        "--kv-cache-memory-bytes", str(int(settings.kv_cache_gib * 2**30)),
        "--enable-chunked-prefill", "--enforce-eager",
        "--enable-prefix-caching" if settings.engine_prefix_caching
        else "--no-enable-prefix-caching",
    ]


@contextlib.contextmanager
def vllm_server(args: argparse.Namespace, settings: Settings, log: Path) -> Iterator[
        tuple[str, int]]:
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
               "--port", str(port), "--model", str(args.model_path), "--served-model-name",
               MODEL_NAME, "--seed", "0", *_engine_args(settings)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKQ_")}
    env.update(VLLM_CPU_NUM_OF_RESERVED_CPU="0")
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    with log.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"vLLM's server exited; see {log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            time.sleep(1)
        else:
            raise RuntimeError(f"vLLM's server not ready after 300 s; see {log}")
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()


def _stack_settings(args: argparse.Namespace, data_dir: Path) -> Settings:
    return Settings(
        database_url=args.database_url, redis_url=args.redis_url, data_dir=data_dir,
        model_path=args.model_path, api_port=free_port(), flower_port=free_port(),
        num_instances=1, engine_kind="vllm", length_predictor="learned",
        routing_policy=args.policy, route_in_predict=not args.route_task,
        route_in_api=_routes_in_api(args),
        held_connections_team_caps={LOCAL_TEAM: TEAM_HELD_CAP},
        length_fast_model_path=args.length_model,
    )


# --- report ---------------------------------------------------------------------------------------
def _routes_in_api(args: argparse.Namespace) -> bool:
    return not (args.predict_task or args.route_task)


def _routed_where(args: argparse.Namespace) -> str:
    if _routes_in_api(args):
        return "in the API process that accepted the request (route_in_api)"
    return "by the route task, after a hop" if args.route_task else "in the predict task"


def _metric(result: dict[str, Any], name: str) -> float | None:
    value = result.get(name)
    return None if value is None else float(value)


def report(phases: list[Phase], idle: dict[str, float], meta: dict[str, str]) -> str:
    lines = []
    lines.append("### Served: vLLM's benchmark client against both servers\n")
    lines.append("| server | placement | load | completed | failed | TTFT p50 (ms) | TTFT p99 (ms) "
                 "| E2E p50 (ms) | output tok/s | req/s | load average at start / end |")
    lines.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for p in phases:
        r = p.result
        lines.append(
            f"| {p.server} | {p.placement} | {p.load.label} | {r.get('completed')} "
            f"| {r.get('failed', 0)} | {fmt(_metric(r, 'p50_ttft_ms'), 1)} "
            f"| {fmt(_metric(r, 'p99_ttft_ms'), 1)} | {fmt(_metric(r, 'p50_e2el_ms'), 1)} "
            f"| {fmt(_metric(r, 'output_throughput'), 0)} "
            f"| {fmt(_metric(r, 'request_throughput'), 2)} "
            f"| {p.loads[0]:.2f} / {p.loads[1]:.2f} |")
    ratio = _saturation_ratio(phases)
    if ratio is not None:
        lines.append(f"\nOutput throughput at {SATURATION_CONCURRENCY} concurrent, blockq / "
                     f"vLLM's server: **{ratio:.2f}x**.")
    lines.extend(_ttft_deltas(phases))

    lines.append("\n### Accept -> admit in blockq (ms, from the requests' timestamps)\n")
    lines.append("| placement | load | n | " + " | ".join(
        f"{c} p50 | {c} p99" for c in LATENCY_COLUMNS) + " |")
    lines.append("|---|---|---:|" + "---:|---:|" * len(LATENCY_COLUMNS))
    for p in phases:
        if p.server != "blockq":
            continue
        n = p.latency.get("accept->admit", (0, 0, 0))[2]
        cells = []
        for c in LATENCY_COLUMNS:
            p50, p99, _ = p.latency.get(c, (None, None, 0))
            cells.append(f"{fmt(p50, 1)} | {fmt(p99, 1)}")
        lines.append(f"| {p.placement} | {p.load.label} | {n} | " + " | ".join(cells) + " |")

    lines.append("\n### CPU per request (ms of CPU time per completed request)\n")
    lines.append("Gross: over the load window; net: less the role's idle rate over the same "
                 "window. Idle: CPU ms per second with nothing sent. * shared with every other "
                 "database and Redis user of the machine.\n")
    cpu_phases = [p for p in phases if p.result.get("completed")]
    header = "| role | idle (ms/s) | " + " | ".join(
        f"{p.server} {p.placement.split()[0]} {p.load.label}" for p in cpu_phases) + " |"
    lines.append(header)
    lines.append("|---|---:|" + "---:|" * len(cpu_phases))
    roles = [*ROLES.values(), PG_BACKENDS, PG_SHARED, REDIS, BLOCKQ_PROCESSES, CONTROL_PLANE,
             ENGINE_WORKER, "vLLM server (API + engine)"]
    for role in roles:
        cells = []
        for p in cpu_phases:
            seconds = _role_cpu(p.cpu, role)
            if seconds is None:
                cells.append("")
                continue
            n = p.result["completed"]
            net = seconds - _role_idle(idle, role) * p.window_s
            cells.append(f"{seconds / n * 1000:.1f} ({net / n * 1000:.1f} net)")
        if not any(cells):
            continue
        lines.append(f"| {role} | {_role_idle(idle, role) * 1000:.1f} | " + " | ".join(cells)
                     + " |")
    lines.append("\n" + " ".join(f"{k}: {v}." for k, v in meta.items()))
    return "\n".join(lines)


#: The rows that sum others: row -> the roles it sums.
SUMS = {CONTROL_PLANE: (*ROLES.values(), PG_BACKENDS), BLOCKQ_PROCESSES: tuple(ROLES.values())}


def _role_cpu(cpu: dict[str, float], role: str) -> float | None:
    if role in SUMS:
        parts = [cpu[r] for r in SUMS[role] if r in cpu]
        return sum(parts) if parts else None
    return cpu.get(role)


def _role_idle(idle: dict[str, float], role: str) -> float:
    if role in SUMS:
        return sum(idle.get(r, 0.0) for r in SUMS[role])
    return idle.get(role, 0.0)


def _ttft_deltas(phases: list[Phase]) -> list[str]:
    """blockq's TTFT minus vLLM's server's at the fixed rate (issue 30: p50 within +20 ms, p99
    within +100 ms)."""
    first_rate = next((p.load.rate for p in phases if p.load.rate is not None), None)
    by_server = {p.server: p.result for p in phases
                 if first_rate is not None and p.load.rate == first_rate}
    if set(by_server) != {"blockq", "vllm"}:
        return []
    deltas = []
    for pct in ("p50", "p99"):
        ours = _metric(by_server["blockq"], f"{pct}_ttft_ms")
        theirs = _metric(by_server["vllm"], f"{pct}_ttft_ms")
        if ours is not None and theirs is not None:
            deltas.append(f"TTFT {pct} {ours - theirs:+.1f} ms")
    return [f"At the fixed rate, blockq minus vLLM's server: {', '.join(deltas)}."]


def _saturation_ratio(phases: list[Phase]) -> float | None:
    def throughput(server: str) -> float | None:
        for p in phases:
            if p.server == server and p.load.concurrency == SATURATION_CONCURRENCY:
                return _metric(p.result, "output_throughput")
        return None

    ours, theirs = throughput("blockq"), throughput("vllm")
    return ours / theirs if ours and theirs else None


def _document(results: str, load_before: tuple[float, float, float],
              load_after: tuple[float, float, float], note: str) -> str:
    command = " ".join(["scripts/bench_control_plane.py", *sys.argv[1:]])
    cores = len(os.sched_getaffinity(0))
    loaded = load_before[0] > QUIET_LOAD
    return "\n".join([
        "# Control-plane cost: blockq beside vLLM's own server (issues 14 and 30)",
        "",
        "Produced by",
        "",
        f"    .venv/bin/python {command}",
        "",
        "(scripts/bench_control_plane.py says what each number is.) "
        + (f"**Taken on a loaded machine** (load average {load_before[0]:.1f} on {cores} cores "
           "at the start, other work running beside it): the timings are inflated and noisy, "
           "and the shared PostgreSQL and Redis lines count other users' work too. Rerun on a "
           "quiet machine for the figures to quote." if loaded else
           f"Load average {load_before[0]:.2f} on {cores} cores at the start, "
           f"{load_after[0]:.2f} at the end (the end includes the run's own saturating "
           "loads); nothing else ran beside it."),
        "",
        *([note, ""] if note else []),
        results,
    ])


# --- main -----------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few requests per load")
    parser.add_argument("--rate", type=float, default=8.0,
                        help="the fixed rate at which TTFT is compared")
    parser.add_argument("--rate-prompts", type=int, default=200)
    parser.add_argument("--cpu-rate", type=float, default=20.0,
                        help="a second fixed rate, for CPU per request (0: none)")
    parser.add_argument("--concurrent-prompts", type=int, default=400,
                        help=f"prompts of the {SATURATION_CONCURRENCY}-concurrent load")
    parser.add_argument("--many-prompts", type=int, default=512,
                        help=f"prompts of the {MANY_CONCURRENT}-concurrent load")
    parser.add_argument("--pinned", action="store_true",
                        help="also run the fixed rate with the predict worker on a core alone")
    parser.add_argument("--quiet-load", type=float, default=1.0,
                        help="wait for the 1-minute load average to fall below this first")
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--policy", default="block", help="the routing policy of blockq")
    parser.add_argument("--length-model", type=Path, default=None,
                        help="the hot path's (fast) length head (default: the shipped static "
                        "head)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--route-in-api", action="store_true",
                       help="the API predicts and routes held completions (route_in_api: the "
                       "default)")
    where.add_argument("--predict-task", action="store_true",
                       help="predict and route in the predict task, after a hop through the "
                       "predict queue (route_in_api off)")
    where.add_argument("--route-task", action="store_true",
                       help="predict in the predict task, route in the route task, after a "
                       "second hop (route_in_api and route_in_predict off)")
    parser.add_argument("--ready-timeout-s", type=float, default=900.0,
                        help="how long the stack may take to start (a loaded machine is slow)")
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--only", nargs="+", default=None, metavar="LOAD",
                        help="run only these loads, by label ('8 req/s', '256 concurrent'): one "
                        "point again, alone")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-path", type=Path,
                        default=TINY_MODEL)
    add_service_arguments(parser)
    parser.add_argument("--keep-logs", type=Path, default=None, metavar="DIR",
                        help="copy the stack's logs and vllm bench's detailed results here")
    parser.add_argument("--note", default="", help="a paragraph for the document")
    parser.add_argument("--write-doc", type=Path, default=None,
                        help="write the results (Markdown) to this file")
    args = parser.parse_args()
    stop_stacks_on_sigterm()
    if args.smoke:
        args.rate_prompts, args.concurrent_prompts, args.many_prompts, args.idle_s = 16, 48, 64, 3

    moderate = Load(f"{args.rate:g} req/s", args.rate_prompts, args.rate, None)
    second = ((Load(f"{args.cpu_rate:g} req/s", round(args.rate_prompts * args.cpu_rate
                                                   / args.rate), args.cpu_rate, None),)
              if args.cpu_rate else ())
    loads = (moderate, *second,
             Load(f"{SATURATION_CONCURRENCY} concurrent", args.concurrent_prompts, None,
                  SATURATION_CONCURRENCY),
             Load(f"{MANY_CONCURRENT} concurrent", args.many_prompts, None, MANY_CONCURRENT))
    if args.only:
        unknown = set(args.only) - {load.label for load in loads}
        if unknown:
            parser.error(f"no such load: {', '.join(sorted(unknown))} "
                         f"(the loads: {', '.join(load.label for load in loads)})")
        loads = tuple(load for load in loads if load.label in args.only)
    database = sa.engine.make_url(args.database_url).database or ""
    phases: list[Phase] = []
    with contextlib.ExitStack() as measuring:
        measuring.enter_context(quiet.measurement())
        load_before = quiet.wait_for_quiet(args.quiet_load)
        phases, idle = _run(args, loads, moderate, database)
    load_after = os.getloadavg()
    print(f"load average at the end: {' / '.join(f'{x:.2f}' for x in load_after)}", flush=True)
    meta = {
        "Machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores, "
                   f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
        "Load average (1/5/15 min) before": " / ".join(f"{x:.2f}" for x in load_before),
        "after": " / ".join(f"{x:.2f}" for x in load_after),
        "blockq": f"policy {args.policy}, learned length predictor "
        f"{(args.length_model or head_artifact('fast')).name}, routed " + _routed_where(args)
        + f", team cap {TEAM_HELD_CAP} held connections",
        "Workload": f"random {INPUT_LEN}-token prompts, {OUTPUT_LEN} output tokens, ignore_eos",
        "Loads": ", ".join(f"{load.label} x {load.num_prompts}" for load in loads),
    }
    text = report(phases, idle, meta)
    print()
    print(text)
    if args.write_doc is not None:
        args.write_doc.write_text(_document(text, load_before, load_after, args.note) + "\n")
    return 0


def _run(args: argparse.Namespace, loads: tuple[Load, ...], moderate: Load, database: str
         ) -> tuple[list[Phase], dict[str, float]]:
    """Both servers under every load, one after the other; the phases and blockq's idle CPU."""
    phases: list[Phase] = []
    with tempfile.TemporaryDirectory(prefix="blockq-bench-cp-") as tmp:
        out_dir, data_dir = Path(tmp) / "results", Path(tmp) / "data"
        out_dir.mkdir()
        data_dir.mkdir()
        settings = _stack_settings(args, data_dir)

        if not args.skip_vllm:
            print("vLLM's own OpenAI server", flush=True)
            with vllm_server(args, settings, Path(tmp) / "vllm-server.log") as (url, pid):
                meter = CpuMeter({"vLLM server (API + engine)": pid}, database)
                for load in loads:
                    phases.append(_run_phase("vllm", "shared", load, url, args, meter, out_dir,
                                             None))

        print("blockq", flush=True)
        fresh_services(args.database_url, args.redis_url)
        stack = bench_stack(settings)
        db = sa.create_engine(args.database_url)
        try:
            stack.start()
            stack.wait_ready(num_instances=1, timeout_s=args.ready_timeout_s)
            roots = {ROLES.get(name, ENGINE_WORKER): p.pid for name, p in stack.processes.items()}
            meter = CpuMeter(roots, database)
            placement = _pin_stack(stack, predict_alone=False)
            # One request through the whole path first: models loaded, connections open.
            bench_serve(stack.api_url, args.model_path, out_dir, "warmup", num_prompts=4,
                        rate=None, concurrency=2, api_key=stack.api_key, seed=args.seed + 1)
            idle = _idle(meter, args.idle_s)
            for load in loads:
                phases.append(_run_phase("blockq", placement, load, stack.api_url, args, meter,
                                         out_dir, stack.api_key))
            if args.pinned:
                placement = _pin_stack(stack, predict_alone=True)
                phases.append(_run_phase("blockq", placement, moderate, stack.api_url, args,
                                         meter, out_dir, stack.api_key))
                _pin_stack(stack, predict_alone=False)
            for phase in phases:
                if phase.server == "blockq":
                    phase.latency = _latencies(db, phase)
        finally:
            stack.stop()
            db.dispose()
            if args.keep_logs is not None:
                # NOTE: what a failed point's clients were told is in the API's log.
                shutil.copytree(data_dir / "logs", args.keep_logs, dirs_exist_ok=True)
                shutil.copytree(out_dir, args.keep_logs / "results", dirs_exist_ok=True)
    return phases, idle
