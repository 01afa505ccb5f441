"""The autoscaling benchmark's runs (issue 42): the day of `benchmarks.autoscale_day` replayed
through the real pipeline (API, Celery workers, PostgreSQL, Redis, emulated GPUs in scaled time)
twice: on the autoscaled fleet (the local stack's autoscaler, as `blockq serve` runs it) and on a
static fleet sized for the peak.

Every request is a native request with a webhook to a receiver on 127.0.0.1. Emulated seconds
are wall seconds / `time_scale` (the engines, the day, the cold starts and the autoscaler's
intervals are all scaled by it). Control-plane overheads (API, predict, route: tens of wall
milliseconds) are not scaled, so in emulated terms they grow by 1 / time_scale: keep time_scale
near 0.1 or above for TTFT figures that mean something.

Printed: price-weighted GPU-hours, the share of requests within their TTFT target (those that
arrived while their model was at zero apart), their first tokens after a scale from zero against
the cold start, scale-down events with lost / done twice / missing webhook counts, the cold
starts measured, and the load average at the start and the end. Plot: demand, instances per GPU
kind and TTFT over the day.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import redis
from sqlalchemy import func, select

from app.cli.autoscaler import COLD_STARTS_KEY, StackAutoscaler, policy_of
from app.cli.stack import free_port
from benchmarks.autoscale_day import (
    DayFigures,
    DayRequest,
    Outcome,
    Sample,
    day_trace,
    figures,
    gpu_hours,
    peak_counts,
    replay_decisions,
)
from benchmarks.local import bench_stack, fresh_services
from benchmarks.paths import DATA_DIR, ROOT, TINY_MODEL
from domain.autoscale_record import decision_counts
from domain.db import Database
from domain.live_fleet import Fleet
from domain.models import InferenceRequest, RequestEvent
from domain.settings import Settings
from workers.autoscale.catalog import parse_prices
from workers.autoscale.decide import EntryState, SaturationSizer
from workers.cluster_sim import load_azure_trace

__all__ = ["DayConfig", "FleetEntry", "MIXED_FLEET", "build_trace", "decision_cpu_s", "main",
           "plot", "run_day", "static_fleet"]

CATALOG = ROOT / "workers" / "plan" / "data" / "catalog.json"
AZURE = DATA_DIR / "traces" / "azure"


@dataclass(frozen=True, slots=True)
class FleetEntry:
    """One entry of the benchmark's fleet (BLOCKQ_FLEET fields)."""

    model: str
    gpu_kind: str  # a kind of the planner's catalog (its price)
    exec_model: str
    min_count: int
    max_count: int


#: The emulated mixed fleet: chat on A30s, A100s or H100s, code on A100s (Llama-3-8B).
MIXED_FLEET = (
    FleetEntry("chat", "A30", "llama-2-7b-a30", 1, 2),
    FleetEntry("chat", "A100-80GB", "llama-2-7b-a100", 0, 3),
    FleetEntry("chat", "H100-80GB", "llama-2-7b-h100", 0, 2),
    FleetEntry("code", "A100-80GB", "llama-3-8b-a100", 0, 2),
)


@dataclass(frozen=True)
class DayConfig:
    """The day and the autoscaler's knobs, in emulated seconds."""

    # NOTE: sized for a 2-core machine running the whole pipeline: the wall rate is the
    # emulated one / time_scale (6 req/s at the chat peak), a run 30 wall minutes.
    day_s: float = 3600.0  # 24 hours compressed 24 times
    time_scale: float = 0.5  # wall seconds per emulated second
    chat_peak_rps: float = 3.0
    code_rps: float = 1.0
    start_s: float = 60.0  # every instance's emulated cold start
    interval_s: float = 30.0
    window_s: float = 300.0
    scale_down_after_s: float = 240.0
    headroom: float = 1.25
    ttft_target_s: dict[str, float] = field(default_factory=lambda: {"chat": 2.0,
                                                                      "code": 5.0})
    max_model_len: int = 4096
    num_requests: int | None = None  # cut the day's trace (a smoke run)


def build_trace(config: DayConfig) -> list[DayRequest]:
    chat = load_azure_trace(AZURE / "AzureLLMInferenceTrace_conv.csv",
                            max_model_len=config.max_model_len)
    code = load_azure_trace(AZURE / "AzureLLMInferenceTrace_code.csv",
                            max_model_len=config.max_model_len)
    trace = day_trace(chat, code, day_s=config.day_s, chat_peak_rps=config.chat_peak_rps,
                      code_rps=config.code_rps, max_model_len=config.max_model_len)
    return trace[:config.num_requests] if config.num_requests else trace


def _entry_states(fleet: Sequence[FleetEntry], prices: dict[str, float]) -> list[EntryState]:
    return [EntryState(i, e.model, e.gpu_kind, e.exec_model, e.min_count, e.max_count, 0,
                       prices[e.gpu_kind]) for i, e in enumerate(fleet)]


def static_fleet(trace: Sequence[DayRequest], fleet: Sequence[FleetEntry],
                 config: DayConfig) -> dict[int, int]:
    """Entry index -> instances of the static fleet sized for the day's peak (emulated time:
    the sizer at time scale 1 on emulated arrival times)."""
    settings = _settings(fleet, config, autoscaled=True, counts=None, data_dir=Path("."),
                         database_url="", redis_url="", webhook_port=0)
    policy = policy_of(settings.model_copy(update={
        "autoscale_window_s": config.window_s, "autoscale_interval_s": config.interval_s,
        "emulated_time_scale": 1.0}))
    sizer = SaturationSizer(max_model_len=config.max_model_len)
    return peak_counts(trace, _entry_states(fleet, parse_prices(CATALOG.read_text())), sizer,
                       policy)


def _settings(fleet: Sequence[FleetEntry], config: DayConfig, *, autoscaled: bool,
              counts: dict[int, int] | None, data_dir: Path, database_url: str,
              redis_url: str, webhook_port: int) -> Settings:
    entries = []
    for index, e in enumerate(fleet):
        entry: dict[str, Any] = {"model": e.model, "engine": "emulated",
                                 "exec_model": e.exec_model, "gpu_kind": e.gpu_kind,
                                 "model_path": str(TINY_MODEL), "start_s": config.start_s}
        if autoscaled:
            entry |= {"count": e.min_count, "min_count": e.min_count, "max_count": e.max_count}
        else:
            assert counts is not None
            if counts[index] == 0:
                continue
            entry["count"] = counts[index]
        entries.append(entry)
    scale = config.time_scale
    return Settings(
        data_dir=data_dir, database_url=database_url or None,
        redis_url=redis_url or "redis://127.0.0.1:6379/14", fleet=json.dumps(entries),
        engine_kind="emulated", emulated_time_scale=scale, max_model_len=config.max_model_len,
        autoscale=autoscaled, autoscale_interval_s=config.interval_s * scale,
        autoscale_window_s=config.window_s * scale,
        autoscale_scale_down_after_s=config.scale_down_after_s * scale,
        autoscale_headroom=config.headroom, autoscale_max_wait_s=3600.0,
        autoscale_catalog=CATALOG, webhook_allowed_networks="127.0.0.0/8",
        api_port=free_port() if webhook_port else 8000, flower_port=free_port(),
        model_path=TINY_MODEL, model_name=fleet[0].model)


class _Receiver:
    """Webhook deliveries by request id: the distinct completion events each got."""

    def __init__(self) -> None:
        self.events: dict[str, set[str]] = defaultdict(set)
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with receiver.lock:
                    receiver.events[body["data"]["id"]].add(body["type"])
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.events.values())


@dataclass
class RunRecord:
    """One run: its figures, the fleet over time, each request's outcome and arrival."""

    figures: DayFigures
    samples: list[Sample]
    outcomes: list[Outcome]
    arrivals_s: list[float]
    cold_starts: list[dict[str, Any]]
    static_counts: dict[int, int] | None = None


def run_day(trace: Sequence[DayRequest], fleet: Sequence[FleetEntry], config: DayConfig, *,
            autoscaled: bool, counts: dict[int, int] | None, work_dir: Path,
            database_url: str, redis_url: str) -> RunRecord:
    """Replay the day on one fleet; every figure of the run."""
    fresh_services(database_url, redis_url)
    receiver = _Receiver()
    label = "autoscaled" if autoscaled else "static peak"
    settings = _settings(fleet, config, autoscaled=autoscaled, counts=counts,
                         data_dir=work_dir / label.replace(" ", "_"),
                         database_url=database_url, redis_url=redis_url, webhook_port=1)
    stack = bench_stack(settings)
    autoscaler: StackAutoscaler | None = None
    try:
        stack.start()
        stack.supervise()
        stack.wait_ready(num_instances=len(settings.initial_instance_ids), timeout_s=600)
        if autoscaled:
            autoscaler = StackAutoscaler(stack, settings)
            autoscaler.start()
        sent = _replay(stack, settings, trace, receiver, config, autoscaler)
        return _collect(label, stack, settings, trace, sent, receiver, config, autoscaler)
    finally:
        if autoscaler is not None:
            autoscaler.stop()
        stack.kill_all()
        receiver.server.shutdown()


@dataclass
class _Sent:
    ids: list[str | None]
    at_zero: list[bool]
    samples: list[Sample]
    started_wall: float
    #: Requests the API did not accept, by status and error (counted as lost).
    refused: Counter[str] = field(default_factory=Counter)


def _replay(stack: Any, settings: Settings, trace: Sequence[DayRequest], receiver: _Receiver,
            config: DayConfig, autoscaler: StackAutoscaler | None) -> _Sent:
    fleet = Fleet(redis.Redis.from_url(settings.redis_url),
                  heartbeat_ttl_s=settings.heartbeat_ttl_s)
    kinds = {slot.instance_id: slot.spec.gpu_kind or "" for slot in settings.fleet_slots}
    sent = _Sent([None] * len(trace), [False] * len(trace), [], time.time())
    done = threading.Event()

    def sample() -> None:
        while not done.wait(config.interval_s * config.time_scale / 3):
            running: Counter[str] = Counter()
            if autoscaler is not None:
                for slot in autoscaler.slots.values():
                    if slot.phase != "stopped":
                        running[kinds[slot.instance_id]] += 1
            else:
                running.update(kinds[i] for i in settings.instance_ids)
            at = (time.time() - sent.started_wall) / config.time_scale
            sent.samples.append(Sample(at, dict(running)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with ThreadPoolExecutor(32) as pool, stack.client(timeout=60) as client:
        def send(index: int, request: DayRequest) -> None:
            live = fleet.model_instances().get(request.model, {})
            sent.at_zero[index] = not any(live.values())
            body = {"model": request.model, "max_tokens": request.output_tokens,
                    "ignore_eos": True, "webhook_url": receiver.url,
                    # Token ids within the tiny model's vocabulary (4,000).
                    "prompt": [100 + (index * 7 + k) % 3800
                               for k in range(request.prompt_tokens)]}
            try:
                response = client.post("/v1/requests", json=body)
            except httpx.HTTPError as exc:
                sent.refused[f"{type(exc).__name__}"] += 1
                return
            if response.status_code == 202:
                sent.ids[index] = response.json()["id"]
            else:
                sent.refused[f"{response.status_code} {response.text[:120]}"] += 1

        futures = []
        for index, request in enumerate(trace):
            delay = sent.started_wall + request.at_s * config.time_scale - time.time()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(send, index, request))
        for future in futures:
            if (exc := future.exception()) is not None:
                sent.refused[repr(exc)[:160]] += 1
    # Until every request has ended, then a quiet spell for the last webhooks.
    db = Database(settings.resolved_database_url)
    ids = [i for i in sent.ids if i]
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        with db.session() as session:
            open_ = session.scalar(select(func.count()).where(
                InferenceRequest.id.in_(ids),
                InferenceRequest.status.not_in(("succeeded", "failed", "cancelled",
                                                "rejected"))))
        if not open_:
            break
        time.sleep(1.0)
    last, quiet_since = -1, time.monotonic()
    while time.monotonic() - quiet_since < 5 and time.monotonic() < deadline:
        if receiver.count() != last:
            last, quiet_since = receiver.count(), time.monotonic()
        time.sleep(0.5)
    db.dispose()
    done.set()
    sampler.join()
    return sent


def _collect(label: str, stack: Any, settings: Settings, trace: Sequence[DayRequest],
             sent: _Sent, receiver: _Receiver, config: DayConfig,
             autoscaler: StackAutoscaler | None) -> RunRecord:
    db = Database(settings.resolved_database_url)
    ids = [i for i in sent.ids if i]
    with db.session() as session:
        rows = {r.id: r for r in session.execute(select(
            InferenceRequest.id, InferenceRequest.status, InferenceRequest.created_at,
            InferenceRequest.first_token_at).where(InferenceRequest.id.in_(ids)))}
        succeeded = Counter(session.scalars(select(RequestEvent.request_id).where(
            RequestEvent.request_id.in_(ids), RequestEvent.status == "succeeded")))
    db.dispose()
    outcomes = []
    for index, request in enumerate(trace):
        request_id = sent.ids[index]
        row = rows.get(request_id) if request_id else None
        ttft = None
        if row is not None and row.first_token_at is not None:
            ttft = _seconds(row.first_token_at, row.created_at) / config.time_scale
        outcomes.append(Outcome(
            request.model, sent.at_zero[index], row.status if row is not None else "missing",
            ttft, succeeded.get(request_id, 0),
            sum(1 for t in receiver.events.get(request_id or "", ())
                if t.endswith("succeeded"))))
    client = redis.Redis.from_url(settings.redis_url)
    downs = sum(n for _, action, n in decision_counts(client) if action == "down")
    cold = [json.loads(raw) for raw in client.lrange(COLD_STARTS_KEY, 0, -1)]
    prices = parse_prices(CATALOG.read_text())
    end_s = trace[-1].at_s if trace else 0.0
    result = figures(label, outcomes, sent.samples, prices, config.ttft_target_s, end_s, downs)
    if sent.refused:
        print(f"{label}: requests not accepted: {dict(sent.refused)}")
    return RunRecord(result, sent.samples, outcomes, [r.at_s for r in trace], cold)


def _seconds(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


def save(path: Path, records: dict[str, RunRecord], config: DayConfig) -> None:
    """The runs as JSON (figures, samples and cold starts; outcomes summarized)."""
    out = {"config": asdict(config), "load_average_end": os.getloadavg()}
    for name, record in records.items():
        out[name] = {"figures": asdict(record.figures),
                     "share_within_target": record.figures.share_within_target,
                     "samples": [asdict(s) for s in record.samples],
                     "cold_starts": record.cold_starts,
                     "static_counts": record.static_counts}
    path.write_text(json.dumps(out, indent=1, default=str))


def plot(path: Path, records: dict[str, RunRecord], config: DayConfig) -> None:
    """Demand per model, instances per GPU kind (autoscaled; the static fleet dashed) and TTFT
    over the day (hours)."""
    import matplotlib  # noqa: PLC0415 - a plotting backend only when a plot is asked for

    matplotlib.use("Agg")
    from matplotlib import pyplot  # noqa: PLC0415

    hour = 24.0 / config.day_s
    figure, (demand, fleet, ttft) = pyplot.subplots(3, 1, figsize=(10, 9), sharex=True)
    auto = records["autoscaled"]
    bucket_h = 0.25
    by_model: dict[str, Counter[int]] = defaultdict(Counter)
    for outcome, at in zip(auto.outcomes, auto.arrivals_s, strict=True):
        by_model[outcome.model][int(at * hour / bucket_h)] += 1
    for model, counts in sorted(by_model.items()):
        xs = sorted(counts)
        demand.plot([x * bucket_h for x in xs],
                    [counts[x] / (bucket_h / hour) for x in xs], label=model)
    demand.set_ylabel("arrivals / emulated s")
    demand.legend()
    kinds = sorted({k for s in auto.samples for k in s.running})
    for kind in kinds:
        fleet.step([s.at_s * hour for s in auto.samples],
                   [s.running.get(kind, 0) for s in auto.samples], where="post", label=kind)
    if "static peak" in records and records["static peak"].samples:
        static = records["static peak"].samples[0].running
        fleet.axhline(sum(static.values()), linestyle="--", color="grey",
                      label=f"static peak fleet ({sum(static.values())})")
    fleet.set_ylabel("instances (autoscaled)")
    fleet.legend()
    for model, target in sorted(config.ttft_target_s.items()):
        points = [(at * hour, o.ttft_s) for o, at in zip(auto.outcomes, auto.arrivals_s,
                                                          strict=True)
                  if o.model == model and o.ttft_s is not None]
        dots = ttft.scatter([p[0] for p in points], [p[1] for p in points], s=3, label=model)
        ttft.axhline(target, linestyle=":", color=dots.get_facecolor()[0],
                     label=f"{model} target {target:g} s")
    ttft.set_yscale("log")
    ttft.set_ylabel("TTFT (emulated s)")
    ttft.set_xlabel("hour of the day")
    ttft.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)


def table_rows(records: dict[str, RunRecord], config: DayConfig) -> list[list[str]]:
    """One row per run: the figures the issue asks for."""
    rows = []
    for name, record in records.items():
        f = record.figures
        cold = config.start_s + 2.0
        at_zero = f.at_zero_ttft_s
        rows.append([
            name, f"{f.gpu_hours_weighted:.2f}", str(f.num_requests),
            f"{100 * f.share_within_target:.2f} %" if f.num_measured else "-",
            str(f.num_at_zero),
            (f"{at_zero[len(at_zero) // 2]:.1f} / {at_zero[-1]:.1f} "
             f"({sum(1 for t in at_zero if t <= cold)} <= {cold:g})") if at_zero else "-",
            str(f.num_scale_downs), str(f.num_lost), str(f.num_twice),
            str(f.num_missing_webhooks)])
    return rows


TABLE_HEADERS = ["fleet", "GPU-hours x $/h", "requests", "within TTFT target",
                 "arrived at zero", "their TTFT p50 / max (<= start + 2 s)", "scale-downs",
                 "lost", "twice", "missing webhooks"]


#: The services every default test run locks: a measurement takes them too, to run alone.
TEST_SERVICES = {
    "BLOCKQ_TEST_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:5432/blockq_test",
    "BLOCKQ_TEST_REDIS_URL": "redis://127.0.0.1:6379/15",
}


def decision_cpu_s(trace: Sequence[DayRequest], fleet: Sequence[FleetEntry],
                   config: DayConfig, repeats: int = 5) -> tuple[float, float]:
    """CPU seconds of one decision over the whole fleet at the day's peak (first, with an
    empty capacity cache, and the median of `repeats` after): a timing."""
    from workers.autoscale.decide import Arrival, Autoscaler  # noqa: PLC0415

    entries = _entry_states(fleet, parse_prices(CATALOG.read_text()))
    peak_at = config.day_s * 15 / 24  # the diurnal curve's peak (15:00)
    history: dict[str, list[Arrival]] = defaultdict(list)
    for r in trace:
        if peak_at - config.window_s <= r.at_s <= peak_at:
            history[r.model].append(Arrival(r.at_s, r.prompt_tokens, r.output_tokens))
    settings = _settings(fleet, config, autoscaled=True, counts=None, data_dir=Path("."),
                         database_url="", redis_url="", webhook_port=0)
    policy = policy_of(settings.model_copy(update={
        "autoscale_window_s": config.window_s, "autoscale_interval_s": config.interval_s}))
    scaler = Autoscaler(policy, SaturationSizer(max_model_len=config.max_model_len))
    times = []
    for _ in range(repeats + 1):
        started = time.process_time()
        scaler.decide(peak_at, entries, history)
        times.append(time.process_time() - started)
    rest = sorted(times[1:])
    return times[0], rest[len(rest) // 2]


def dry_run(trace: Sequence[DayRequest], fleet: Sequence[FleetEntry], config: DayConfig
            ) -> None:
    """The decisions over the day without the pipeline, against the static peak fleet."""
    prices = parse_prices(CATALOG.read_text())
    entries = _entry_states(fleet, prices)
    static = static_fleet(trace, fleet, config)
    settings = _settings(fleet, config, autoscaled=True, counts=None, data_dir=Path("."),
                         database_url="", redis_url="", webhook_port=0)
    policy = policy_of(settings.model_copy(update={
        "autoscale_window_s": config.window_s, "autoscale_interval_s": config.interval_s,
        "autoscale_scale_down_after_s": config.scale_down_after_s, "emulated_time_scale": 1.0}))
    samples, downs = replay_decisions(trace, entries, SaturationSizer(
        max_model_len=config.max_model_len), policy, interval_s=config.interval_s,
        day_s=config.day_s)
    auto = gpu_hours(samples, prices, config.day_s)
    static_cost = sum(prices[fleet[i].gpu_kind] * n for i, n in static.items())
    static_hours = static_cost * config.day_s / 3600
    peak = max(sum(s.running.values()) for s in samples)
    print(f"dry run over the day: static peak fleet {static_cost:.2f} $/h -> "
          f"{static_hours:.3f} price-weighted GPU-hours; autoscaled {auto:.3f} "
          f"({100 * (1 - auto / static_hours):.1f} % fewer); instances 0..{peak}; "
          f"{downs} scale-downs (emulated hours: the whole day is {config.day_s / 3600:g})")


def main(argv: Sequence[str] | None = None) -> None:
    import argparse  # noqa: PLC0415

    from benchmarks import services_lock  # noqa: PLC0415
    from benchmarks.local import BENCH_DATABASE_URL, BENCH_REDIS_URL  # noqa: PLC0415
    from benchmarks.paths import DOCS_IMAGES  # noqa: PLC0415
    from benchmarks.tables import print_table  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = DayConfig()
    parser.add_argument("--day-s", type=float, default=defaults.day_s)
    parser.add_argument("--time-scale", type=float, default=defaults.time_scale)
    parser.add_argument("--chat-peak-rps", type=float, default=defaults.chat_peak_rps)
    parser.add_argument("--code-rps", type=float, default=defaults.code_rps)
    parser.add_argument("--start-s", type=float, default=defaults.start_s)
    parser.add_argument("--interval-s", type=float, default=defaults.interval_s)
    parser.add_argument("--scale-down-after-s", type=float,
                        default=defaults.scale_down_after_s)
    parser.add_argument("--num-requests", type=int, default=None,
                        help="replay only the first N requests of the day (a smoke run)")
    parser.add_argument("--only", choices=["both", "autoscaled", "static"], default="both")
    parser.add_argument("--decision-cpu", action="store_true",
                        help="only time one decision over the whole fleet at the peak")
    parser.add_argument("--dry-run", action="store_true",
                        help="only replay the decisions over the day, no pipeline "
                        "(deterministic: the GPU-hours the live run should come near)")
    parser.add_argument("--out", type=Path, default=ROOT / ".blockq" / "bench_autoscale")
    parser.add_argument("--plot", type=Path, default=DOCS_IMAGES / "autoscale_day.png")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--database-url", default=BENCH_DATABASE_URL)
    parser.add_argument("--redis-url", default=BENCH_REDIS_URL)
    args = parser.parse_args(argv)
    config = DayConfig(day_s=args.day_s, time_scale=args.time_scale,
                       chat_peak_rps=args.chat_peak_rps, code_rps=args.code_rps,
                       start_s=args.start_s, num_requests=args.num_requests,
                       interval_s=args.interval_s, scale_down_after_s=args.scale_down_after_s)
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average at start: {load}", flush=True)
    trace = build_trace(config)
    counts = Counter(r.model for r in trace)
    print(f"day: {len(trace)} requests ({dict(counts)}), {config.day_s:g} emulated s = 24 h, "
          f"{config.day_s * config.time_scale / 60:.1f} wall minutes", flush=True)
    if args.dry_run:  # no services, no timing: needs no lock
        dry_run(trace, MIXED_FLEET, config)
        return
    with services_lock.hold({**TEST_SERVICES, "--database-url": args.database_url,
                             "--redis-url": args.redis_url}):
        if args.decision_cpu:
            first, median = decision_cpu_s(trace, MIXED_FLEET, config)
            print(f"CPU of one decision over the whole fleet ({len(MIXED_FLEET)} entries, "
                  f"2 models) at the peak: {first:.3f} s first (empty capacity cache), "
                  f"{median:.3f} s median after")
        else:
            static = static_fleet(trace, MIXED_FLEET, config)
            print("static fleet sized for the peak: " + ", ".join(
                f"{MIXED_FLEET[i].model}/{MIXED_FLEET[i].gpu_kind} x{n}"
                for i, n in static.items() if n), flush=True)
            records: dict[str, RunRecord] = {}
            args.out.mkdir(parents=True, exist_ok=True)
            if args.only in ("both", "static"):
                records["static peak"] = run_day(
                    trace, MIXED_FLEET, config, autoscaled=False, counts=static,
                    work_dir=args.out, database_url=args.database_url,
                    redis_url=args.redis_url)
                records["static peak"].static_counts = static
            if args.only in ("both", "autoscaled"):
                records["autoscaled"] = run_day(
                    trace, MIXED_FLEET, config, autoscaled=True, counts=None,
                    work_dir=args.out, database_url=args.database_url,
                    redis_url=args.redis_url)
            print_table("Autoscaled vs static peak fleet (emulated time)", TABLE_HEADERS,
                        table_rows(records, config), markdown=args.markdown, width=200)
            if len(records) == 2:
                saved = 1 - (records["autoscaled"].figures.gpu_hours_weighted
                             / records["static peak"].figures.gpu_hours_weighted)
                print(f"price-weighted GPU-hours saved by autoscaling: {100 * saved:.1f} %")
            for record in records.values():
                for cold in record.cold_starts[:10]:
                    print(f"cold start {cold['instance_id']} ({cold['gpu_kind']}): ready "
                          f"{cold['ready_s'] / config.time_scale:.1f} emulated s (model load "
                          f"{(cold['model_load_s'] or 0) / config.time_scale:.1f}), first "
                          f"token {cold['first_token_s'] / config.time_scale:.1f}")
            save(args.out / "results.json", records, config)
            if "autoscaled" in records:
                plot(args.plot, records, config)
                print(f"plot: {args.plot}")
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average at end: {load}")
