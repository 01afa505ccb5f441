"""One measured point: a fresh stack for one (workload, policy, rate), the workload replayed
through the API, the requests' timestamps read back from PostgreSQL.

Every point starts from nothing: the database is dropped and migrated again, the Redis database
flushed (routing ledgers, round-robin ticket, bias watch, length history) and every process
started anew with the point's settings, so no state leaks from one point into the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis
import sqlalchemy as sa

from app.cli.stack import Stack
from benchmarks.live.models import split_by_model
from benchmarks.live.stats import (
    RequestProgress,
    count_done_and_late,
    emulated_s,
    percentile,
    percentile_certainly_above,
    summarize,
    wall_rate,
)
from benchmarks.live.workloads import LiveWorkload, write_jsonl
from benchmarks.local import bench_stack, fresh_services
from domain.live_fleet import Fleet
from domain.settings import Settings

__all__ = ["POLICIES", "PointSpec", "policy_setup", "run_point"]

#: Policy labels -> (routing policy, predictor): learned (the workload's learned predictions:
#: the model in the predict worker, or its table), learned-table (the same model's predictions,
#: made offline by make_live_workload.py, from a table: the routing without the encoder's CPU),
#: oracle, mean, or none (a table of the mean: the policy reads no prediction, the cheapest
#: predictor keeps the control plane light).
POLICIES: dict[str, tuple[str | None, str]] = {
    # issue 41: the production default, routing_policy left unset (a pool of one kind
    # round_robin, one of unlike kinds mixed_fleet_routing_policy), learned predictions
    "default": (None, "learned"),
    "round_robin": ("round_robin", "none"),
    "least_requests": ("least_requests", "none"),
    "llumnix": ("llumnix", "none"),
    "prefix_affinity": ("prefix_affinity", "none"),
    "block": ("block", "learned"),
    "block@learned-table": ("block", "learned-table"),
    "block@oracle": ("block", "oracle"),
    "block@mean": ("block", "mean"),
    # issue 31: a fleet of unlike instances (`--fleet`)
    "block_slo": ("block_slo", "learned"),
    "block_slo@oracle": ("block_slo", "oracle"),
    "capacity_weighted": ("capacity_weighted", "learned"),
}

#: Control-plane processes of the stack (the rest are the emulated engines gpu.<k>).
CONTROL_PLANE = ("api", "predict", "predict_bulk", "route", "health", "batches", "webhooks",
                 "beat", "flower")

_TERMINAL = ("succeeded", "failed", "cancelled")
#: Tries of one POST when its connection drops before the answer.
SEND_ATTEMPTS = 3
#: Wall seconds of idle CPU sampling before the requests are sent.
IDLE_SAMPLE_S = 10.0


@dataclass(frozen=True)
class PointSpec:
    workload: LiveWorkload
    policy: str
    rate: float  # emulated requests per second
    time_scale: float
    instances: int
    database_url: str
    redis_url: str
    model_path: Path
    api_port: int
    flower_port: int
    max_model_len: int
    #: Longest wait (wall s) for the last request after the last arrival.
    drain_timeout_s: float
    bias_watch: bool = False
    #: TTFT p99 bound (emulated s): when set, the point stops (sending included) as soon as
    #: enough requests are later than it that the p99 is certain to exceed it.
    stop_above_slo_s: float | None = None
    #: The emulated GPU: a bundled execution-time model and its KV blocks (the discrete-event
    #: benchmark's NUM_BLOCKS: qwen2-7b-a30 7289, llama-2-7b-a30 1052).
    exec_model: str = "qwen2-7b-a30"
    num_blocks: int = 7289
    #: A fleet of unlike instances (`BLOCKQ_FLEET` JSON, every entry sized: hardware, KV blocks,
    #: max_num_seqs, capacity) instead of `instances` alike ones of `exec_model`.
    fleet: str | None = None


def policy_setup(policy: str, workload: LiveWorkload) -> tuple[str | None, str, str | None]:
    """(routing policy or None: the default, Settings.length_predictor, table mode or None)
    of a policy label."""
    routing, predictor = POLICIES[policy]
    if predictor == "learned":
        if workload.learned_live:
            return routing, "learned", None
        if all(r.learned_tokens is not None for r in workload.requests):
            return routing, "table", "learned"
        raise ValueError(f"{policy}: workload {workload.name} has no learned predictions")
    if predictor == "learned-table":
        if any(r.learned_tokens is None for r in workload.requests):
            raise ValueError(f"{policy}: workload {workload.name} has no learned predictions")
        return routing, "table", "learned"
    return routing, "table", "mean" if predictor == "none" else predictor


def _settings(spec: PointSpec, data_dir: Path) -> Settings:
    routing, predictor, table = policy_setup(spec.policy, spec.workload)
    answers = write_jsonl(data_dir / "answers.jsonl", spec.workload.answers_rows())
    extra: dict[str, Any] = {}
    if table is not None:
        extra["length_predictions_path"] = write_jsonl(data_dir / f"predictions_{table}.jsonl",
                                                       spec.workload.table_rows(table))
    if spec.workload.length_model_path is not None:
        # The held-out head on both paths (the shipped ones saw the workload's prompts).
        extra["length_model_path"] = spec.workload.length_model_path
        extra["length_fast_model_path"] = spec.workload.length_model_path
    if not spec.bias_watch:
        # The benchmark measures each policy as configured: no round-robin fallback (no error
        # exceeds the threshold), no correction factor (learned predictions stay the model's).
        extra |= {"bias_threshold": 1e9, "bias_correction_rate": 0.0}
    if routing is not None:  # None: left unset, so each pool takes the production default
        extra["routing_policy"] = routing
    return Settings(
        database_url=spec.database_url, redis_url=spec.redis_url, data_dir=data_dir,
        model_path=spec.model_path, model_name=spec.workload.serving_model,
        api_port=spec.api_port, flower_port=spec.flower_port,
        num_instances=spec.instances, engine_kind="emulated",
        emulated_exec_model=spec.exec_model, emulated_num_blocks=spec.num_blocks, block_size=16,
        max_num_seqs=48, max_num_batched_tokens=512, max_model_len=spec.max_model_len,
        emulated_time_scale=spec.time_scale, emulated_output_lengths="answers",
        emulated_answers_path=answers,
        length_predictor=predictor,
        # NOTE: prefix caching only where the workload shares prefixes by design (Mooncake's
        # hash ids): the conversations replay repeats 167 held-out prompts, which would turn
        # into cache hits that production traffic does not have and the discrete-event
        # comparison does not model.
        engine_prefix_caching=spec.workload.name == "mooncake",
        # No retraining, refitting or model swaps mid-run: the router simulates the configured
        # exec model (the engines' ground truth) and the predictor keeps its model.
        learn_retrain_interval_s=0, learn_refit_interval_s=0,
        log_format="text", **extra, **({"fleet": spec.fleet} if spec.fleet else {}))


class _LoadSampler(threading.Thread):
    """os.getloadavg() every few seconds while a point runs."""

    def __init__(self, every_s: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.every_s, self.samples, self.stop = every_s, [os.getloadavg()[0]], threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.samples.append(os.getloadavg()[0])


def _cpu_s(stack: Stack) -> dict[str, float]:
    """CPU seconds (user + system) so far of each stack process and its children."""
    try:
        import psutil  # noqa: PLC0415 - optional: no CPU accounting without it
    except ImportError:
        return {}
    out: dict[str, float] = {}
    for name, process in stack.processes.items():
        try:
            parent = psutil.Process(process.pid)
            total = 0.0
            for p in [parent, *parent.children(recursive=True)]:
                times = p.cpu_times()
                total += times.user + times.system
            out[name] = total
        except psutil.Error:
            continue
    return out


def _text_of(answer: httpx.Response | Exception) -> str:
    """An answer's body, or the exception that stood for it."""
    return answer.text if isinstance(answer, httpx.Response) else repr(answer)


async def _post(client: httpx.AsyncClient, body: dict[str, Any], *, idempotency_key: str
                ) -> tuple[httpx.Response | Exception, int]:
    """POST one request as a careful client does: with an Idempotency-Key, and again when the
    connection drops before the answer (a kept-alive connection the server closed meanwhile);
    the key makes a retry answer with the request the first try created. (answer, tries)."""
    answer: httpx.Response | Exception = RuntimeError("not tried")
    for attempt in range(1, SEND_ATTEMPTS + 1):
        try:
            return await client.post("/v1/requests", json=body,
                                     headers={"Idempotency-Key": idempotency_key}), attempt
        except httpx.TransportError as error:
            answer = error
        except httpx.HTTPError as error:
            return error, attempt
    return answer, SEND_ATTEMPTS


def _status_and_id(answer: httpx.Response | Exception) -> tuple[int, str | None]:
    if not isinstance(answer, httpx.Response):
        return 0, None
    try:
        body = answer.json()
    except ValueError:
        return answer.status_code, None
    return answer.status_code, body.get("id") if isinstance(body, dict) else None


async def _send(base_url: str, api_key: str, workload: LiveWorkload,
                wall_rate_per_s: float, abandon: threading.Event) -> list[dict[str, Any]]:
    """POST every request at its arrival time (one task each: a slow answer never delays the
    next arrival); returns per request the scheduled and actual send times and the answer.
    Once `abandon` is set the requests not yet due are not sent (status 0, error "not sent")."""
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=128)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=120,
                                 headers={"Authorization": f"Bearer {api_key}"}) as client:
        start = time.time() + 0.5
        loop_start = time.perf_counter() + 0.5

        called_off = asyncio.Event()

        async def call_off_when_abandoned() -> None:
            """Wakes every request still waiting for its arrival time once `abandon` is set
            (one poll for all: the waiting requests never wake before their time otherwise)."""
            while not abandon.is_set():
                await asyncio.sleep(0.5)
            called_off.set()

        async def one(i: int) -> dict[str, Any]:
            r = workload.requests[i]
            due = workload.unit_arrival_s[i] / wall_rate_per_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(called_off.wait(),
                                       max(0.0, loop_start + due - time.perf_counter()))
            sent = time.perf_counter() - loop_start
            if called_off.is_set():
                return {"i": i, "due": due, "sent": sent, "answered": sent, "status": 0,
                        "id": None, "error": "not sent"}
            body = {"prompt": r.prompt, "max_tokens": r.max_tokens, "temperature": 0}
            if r.model is not None:
                body["model"] = r.model
            answer, attempts = await _post(client, body, idempotency_key=f"bench-{i}")
            status, rid = _status_and_id(answer)
            accepted = status in (200, 202) and rid is not None
            return {"i": i, "due": due, "sent": sent, "answered": time.perf_counter() - loop_start,
                    "status": status, "id": rid, "attempts": attempts,
                    "error": None if accepted else f"{status}: {_text_of(answer)[:200]}"}

        monitor = asyncio.create_task(call_off_when_abandoned())
        results = await asyncio.gather(*(one(i) for i in range(len(workload.requests))))
        monitor.cancel()
        for row in results:
            row["sent_epoch"] = start + row["sent"]
        return list(results)


class _Watcher(threading.Thread):
    """Once a second, counts the requests that are done and those certainly later than the
    SLO; sets `missed` once the late ones make the TTFT p99 certain to exceed it.

    NOTE: the engine worker writes `first_token_at` with the completion, so a running
    request's first token is not in PostgreSQL. A request counts as late only when that is
    certain: ended with its first token (or none) past the SLO; shown without output in its
    engine's published state taken past the SLO; or not yet admitted by an engine worker
    (`started_at` unset, read after the states) past the SLO. The states are read first, so a
    request cannot slip between the two reads unseen.
    """

    def __init__(self, spec: PointSpec, total: int) -> None:
        super().__init__(daemon=True)
        self.engine = sa.create_engine(spec.database_url)
        self.fleet = Fleet(redis.Redis.from_url(spec.redis_url), heartbeat_ttl_s=3600.0)
        self.total, self.done, self.late = total, 0, 0
        self.slo_wall_s = (spec.stop_above_slo_s * spec.time_scale
                           if spec.stop_above_slo_s is not None else None)
        self.missed, self.stop = threading.Event(), threading.Event()

    def run(self) -> None:
        try:
            while not self.stop.wait(1.0):
                try:
                    self.done, self.late = self._count()
                except (sa.exc.SQLAlchemyError, redis.RedisError) as error:
                    print(f"  watcher: count failed ({error!r}); next second", flush=True)
                    continue
                if self.slo_wall_s is not None and percentile_certainly_above(
                        self.late, self.total, 99):
                    self.missed.set()
        finally:
            self.engine.dispose()

    def _count(self) -> tuple[int, int]:
        waiting_since: dict[str, float] = {}  # request -> taken_at of a state showing no output
        for status in self.fleet.statuses():
            for request in status.state.requests if status.state else ():
                if request.num_output_tokens == 0:
                    waiting_since[request.request_id] = status.state.taken_at
        with self.engine.connect() as conn:
            read_at = conn.execute(sa.text("SELECT extract(epoch FROM clock_timestamp())")
                                   ).scalar_one()
            rows = conn.execute(sa.text(
                "SELECT id, status, extract(epoch FROM created_at), "
                "extract(epoch FROM first_token_at), started_at IS NULL FROM requests")).all()
        slo = self.slo_wall_s if self.slo_wall_s is not None else math.inf
        return count_done_and_late(
            [RequestProgress(str(rid), status in _TERMINAL, float(created),
                             None if first is None else float(first), bool(not_admitted))
             for rid, status, created, first, not_admitted in rows],
            waiting_since, float(read_at), slo)

    def wait(self, accepted: int, deadline: float) -> None:
        """Until `accepted` requests are done, the SLO is certainly missed, or the deadline."""
        while self.done < accepted and not self.missed.is_set() and time.time() < deadline:
            time.sleep(0.5)
        self.stop.set()
        self.join()


def _rows(database_url: str) -> list[dict[str, Any]]:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT id, status, prompt_tokens, output_tokens, predicted_output_tokens, "
                "predictor, instance_id, policy, attempt, "
                "(routing -> 'fallback') IS NOT NULL AS fallback, "
                "extract(epoch FROM created_at) AS created, "
                "extract(epoch FROM routed_at) AS routed, "
                "extract(epoch FROM started_at) AS started, "
                "extract(epoch FROM first_token_at) AS first_token, "
                "extract(epoch FROM finished_at) AS finished "
                "FROM requests"))
            return [dict(row._mapping) for row in rows]
    finally:
        engine.dispose()


def run_point(spec: PointSpec, log: Any = print) -> dict[str, Any]:
    """Measure one point; the raw result (per-request samples included) as a dict."""
    fresh_services(spec.database_url, spec.redis_url)
    wall_per_s = wall_rate(spec.rate, spec.time_scale)
    workload = spec.workload
    with tempfile.TemporaryDirectory(prefix="blockq-live-") as tmp:
        settings = _settings(spec, Path(tmp))
        stack = bench_stack(settings)
        started = time.time()
        try:
            stack.start()
            stack.wait_ready(num_instances=spec.instances, timeout_s=600)
            stack.wait_workers_ready(timeout_s=600)
            ready_s = time.time() - started
            # The stack's idle CPU (beat, sweeps, heartbeats, state publishing, polls), to tell
            # the CPU the requests cost from what the stack burns anyway.
            idle_before, idle_t0 = _cpu_s(stack), time.time()
            time.sleep(IDLE_SAMPLE_S)
            idle_after = _cpu_s(stack)
            idle_cores = {k: (idle_after[k] - idle_before.get(k, 0.0)) / (time.time() - idle_t0)
                          for k in idle_after}
            log(f"  stack ready in {ready_s:.0f} s; sending {len(workload.requests)} requests "
                f"at {spec.rate:g}/s emulated ({wall_per_s:.2f}/s wall)")
            sampler = _LoadSampler()
            sampler.start()
            watcher = _Watcher(spec, len(workload.requests))
            watcher.start()
            cpu_before, t0 = _cpu_s(stack), time.time()
            assert stack.api_key is not None
            sends = asyncio.run(_send(stack.api_url, stack.api_key, workload, wall_per_s,
                                      watcher.missed))
            sent_s = time.time() - t0
            accepted = sum(1 for s in sends if s["id"] is not None)
            watcher.wait(accepted, time.time() + spec.drain_timeout_s)
            done, stopped_early = watcher.done, watcher.missed.is_set()
            window_s = time.time() - t0
            cpu_after = _cpu_s(stack)
            sampler.stop.set()
        finally:
            # Read what the point produced, then kill: the database is recreated for the next
            # point, so a graceful shutdown (minutes with requests in flight) buys nothing.
            rows = _rows(spec.database_url)
            stack.kill_all()
    result = _result(spec, sends, rows, done, ready_s, sent_s, window_s, sampler.samples,
                     {k: cpu_after[k] - cpu_before.get(k, 0.0) for k in cpu_after})
    if stopped_early:
        # Stopped once p99 was certain to exceed the bound: the p99 is only known to be above
        # it, and the other figures describe a cut-off run.
        result |= {"stopped_early": True, "late_at_stop": watcher.late,
                   "ttft_s": {"p50": None, "p99": math.inf, "count": len(workload.requests)},
                   "e2e_s": {"p50": None, "p99": None, "count": 0}, "by_model": {}}
    idle = {"control_plane": sum(v for k, v in idle_cores.items() if k in CONTROL_PLANE),
            "engines": sum(v for k, v in idle_cores.items() if k not in CONTROL_PLANE)}
    result["idle_cores"] = idle
    n = 0 if stopped_early else result["requests"]
    # CPU the requests cost: the window's CPU less the idle rate over the window (only when the
    # window covers every request's whole life).
    result["cpu_ms_per_request_above_idle"] = {
        group: ((result["cpu_cores"][group] - idle[group]) * window_s * 1000 / n if n else None)
        for group in idle}
    return result


def _result(spec: PointSpec, sends: list[dict[str, Any]], rows: list[dict[str, Any]], done: int,
            ready_s: float, sent_s: float, window_s: float, load: list[float],
            cpu: dict[str, float]) -> dict[str, Any]:
    scale = spec.time_scale
    by_id = {r["id"]: r for r in rows}
    index = {s["id"]: s["i"] for s in sends if s["id"] is not None}
    inf = float("inf")
    ttft, e2e, overhead, samples, models = [], [], [], [], []
    for rid, i in index.items():
        models.append(spec.workload.requests[i].model)
        row = by_id.get(rid)
        ok = row is not None and row["status"] == "succeeded" and row["first_token"] is not None
        t = float(row["first_token"] - row["created"]) if ok else inf
        e = float(row["finished"] - row["created"]) if ok and row["finished"] else inf
        o = (float(row["routed"] - row["created"])
             if row is not None and row["routed"] is not None else inf)
        ttft.append(t)
        e2e.append(e)
        overhead.append(o)
        truth = spec.workload.requests[i].output_tokens
        samples.append([i, round(emulated_s(t, scale), 4), round(emulated_s(e, scale), 4),
                        row and row["prompt_tokens"], row and row["output_tokens"], truth,
                        row and row["predicted_output_tokens"], row and row["instance_id"]])
    rel_errors = [abs(s[6] - s[5]) / s[5] for s in samples if s[6] is not None and s[5]]
    # The live learned predictions against the offline ones of the same model and serving name
    # (make_live_workload.py): equal unless the name, the model or the predictor differ.
    offline = [(s[6], spec.workload.requests[s[0]].learned_tokens) for s in samples
               if s[6] is not None and spec.workload.requests[s[0]].learned_tokens is not None]
    agreement = (sum(1 for live, off in offline if abs(live - off) <= 1) / len(offline)
                 if offline else None)
    predictors: dict[str, int] = {}
    for row in rows:
        predictors[str(row["predictor"])] = predictors.get(str(row["predictor"]), 0) + 1
    lags = [s["sent"] - s["due"] for s in sends]
    post_s = [s["answered"] - s["sent"] for s in sends]
    control = sum(v for k, v in cpu.items() if k in CONTROL_PLANE)
    engines = sum(v for k, v in cpu.items() if k not in CONTROL_PLANE)
    n = len(sends)
    return {
        "workload": spec.workload.name, "policy": spec.policy, "rate": spec.rate,
        "exec_model": spec.exec_model, "num_blocks": spec.num_blocks, "fleet": spec.fleet,
        "time_scale": scale, "instances": spec.instances,
        "setup": dict(zip(("routing_policy", "length_predictor", "table"),
                          policy_setup(spec.policy, spec.workload), strict=True)),
        "bias_watch": spec.bias_watch,
        "requests": len(sends), "accepted": len(index), "done": done,
        "finished": sum(1 for r in rows if r["status"] in _TERMINAL),
        "succeeded": sum(1 for r in rows if r["status"] == "succeeded"),
        "failed": sum(1 for r in rows if r["status"] == "failed"),
        "rerouted": sum(1 for r in rows if (r["attempt"] or 0) > 1),
        "fallback_routed": sum(1 for r in rows if r["fallback"]),
        "predictors": predictors,
        "table_misses": predictors.get("table.missing", 0),
        "http_errors": sorted({s["error"] for s in sends if s["error"]})[:5],
        "stopped_early": False,
        "ttft_s": summarize(ttft, scale).as_dict(),
        "e2e_s": summarize(e2e, scale).as_dict(),
        # Each model's pool (a fleet of several models): what its own simulation compares with.
        "by_model": split_by_model(models, ttft, e2e, scale, overhead),
        "accept_to_routed_s": summarize(overhead, scale).as_dict(),
        "accept_to_routed_wall_ms": {"p50": percentile(overhead, 50) * 1000,
                                     "p99": percentile(overhead, 99) * 1000},
        "prediction_median_rel_error": percentile(rel_errors, 50) if rel_errors else None,
        "predictions_equal_offline_learned": agreement,
        "client": {"lag_p99_ms": percentile(lags, 99) * 1000,
                   "post_p99_ms": percentile(post_s, 99) * 1000,
                   "posts_retried": sum(1 for s in sends if s.get("attempts", 1) > 1),
                   "send_wall_s": sent_s},
        "wall": {"stack_ready_s": ready_s, "window_s": window_s},
        "load": {"loadavg_1m_mean": sum(load) / len(load), "loadavg_1m_max": max(load),
                 "cpus": os.cpu_count()},
        "cpu_s": {k: round(v, 2) for k, v in sorted(cpu.items())},
        # CPU of the stack's processes over the window (first send to last completion), idle
        # polling included: per request (meaningful near capacity) and in cores (out of cpus).
        "cpu_ms_per_request": {"control_plane": control * 1000 / n if n else None,
                               "engines": engines * 1000 / n if n else None},
        "cpu_cores": {"control_plane": control / window_s, "engines": engines / window_s},
        "notes": spec.workload.notes,
        # [index, ttft, e2e (emulated s), prompt tokens, output tokens, true output tokens,
        #  predicted tokens, instance] per accepted request
        "samples": samples,
    }
