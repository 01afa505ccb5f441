"""Prometheus metrics of blockq: their definitions and the scrape-time collectors (the API's
GET /metrics view is `app/api/metrics.py`).

Two kinds of series:

- **Pushed** where the event happens: the engine host at each completion and each engine step,
  the route task at each decision. Processes write them in prometheus_client's multi-process
  mode (the directory PROMETHEUS_MULTIPROC_DIR, `Settings.prometheus_multiproc_dir`), so the
  API's GET /metrics adds up every process of the host. A worker with no API beside it (an
  engine in its own container) serves its own on `Settings.metrics_port`.
- **Read when scraped**, by collectors: request counts by status and priority, Celery queue
  depths (Redis LLEN), the engines' published states and the bias watch's fallback. Requests in
  flight are counted at every scrape through the (status, updated_at) index; finished requests,
  most of the table, at most every `metrics_counts_cache_s` (the counts are cached in Redis for
  every API process), so a scrape never counts the whole table.

GET /metrics asks for no API key: it is for the Prometheus scraper. With `metrics_token` set it
asks for that token as a bearer token; without, it must not be exposed publicly (it names
instances, queues and request volumes).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol
from wsgiref.simple_server import WSGIServer

import redis
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from domain.autoscale_record import decision_counts, desired_instances
from domain.batches import BATCH_ETA_KEY, BATCH_WINDOW_KEY
from domain.db import Database
from domain.length_bias import fallback_state, relative_error
from domain.live_fleet import Fleet
from domain.models import TERMINAL_STATUSES, InferenceRequest, Priority, RequestStatus
from domain.queues import SERVICE_QUEUES, queue_depths
from domain.services import Services
from domain.settings import Settings

__all__ = [
    "observe_completion",
    "observe_routing",
    "observe_unfinished_targets",
    "observe_affinity",
    "EngineStepMetrics",
    "RequestCountCollector",
    "QueueDepthCollector",
    "FleetCollector",
    "FallbackCollector",
    "GuardedCollectors",
    "scrape_registry",
    "serve_process_metrics",
    "prepare_multiproc_dir",
]

logger = logging.getLogger(__name__)


_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_OVERHEAD_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                       0.25, 0.5, 1, 2.5)
_STEP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25,
                   0.5, 1, 2.5)
_ERROR_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10)

# --- pushed metrics ----------------------------------------------------------------------------
# NOTE: module-level, as prometheus_client intends: a metric is one per process by nature, and
# labelled metrics write nothing until a call site observes a value.
REQUEST_TTFT = Histogram(
    "blockq_request_ttft_seconds",
    "Time to first token of succeeded requests: from creation at the API to the first token.",
    ["instance_id", "priority", "model"], buckets=_LATENCY_BUCKETS_S,
)
REQUEST_E2E = Histogram(
    "blockq_request_e2e_seconds",
    "End-to-end latency of succeeded requests: from creation at the API to the last token.",
    ["instance_id", "priority", "model"], buckets=_LATENCY_BUCKETS_S,
)
LENGTH_PREDICTION_ERROR = Histogram(
    "blockq_length_prediction_error_ratio",
    "Relative error of the output-length prediction of succeeded requests: "
    "|predicted - actual| / actual output tokens.",
    buckets=_ERROR_BUCKETS,
)
LATENCY_PREDICTION_ERROR = Histogram(
    "blockq_latency_prediction_error_ratio",
    "Relative error of the routing what-if's end-to-end latency (policies that simulate, e.g. "
    "block): |predicted - actual| / actual, both from the routing decision.",
    ["policy"], buckets=_ERROR_BUCKETS,
)
ROUTING_DECISIONS = Counter(
    "blockq_routing_decisions_total",
    "Routing decisions that committed, by policy in force and chosen instance.",
    ["policy", "instance_id"],
)
ROUTING_OVERHEAD = Histogram(
    "blockq_routing_overhead_seconds",
    "Scheduling overhead of a request: from entering predict to its publish on the chosen "
    "instance's queue (the routing record's overhead_ms).",
    ["policy"], buckets=_OVERHEAD_BUCKETS_S,
)
ROUTING_DECISION_TIME = Histogram(
    "blockq_routing_decision_seconds",
    "Time the routing policy took to decide (the routing record's decision_ms).",
    ["policy"], buckets=_OVERHEAD_BUCKETS_S,
)
SLO_REQUESTS = Counter(
    "blockq_slo_requests_total",
    "Requests with latency targets, by target kind (ttft, e2e, or all: every target the "
    "request had) and outcome, counted once when the request ends: met or missed (succeeded, "
    "measured from creation; a failed or cancelled request missed them), or rejected (refused "
    "at routing: no instance could meet them). Goodput: the rate of kind=all, outcome=met.",
    ["kind", "outcome"],
)
ROUTING_HELD = Counter(
    "blockq_routing_held_total",
    "Times the router held a request because no instance would start it soon (late binding, "
    "routing_hold); a request released and held again counts again.",
)
SESSION_AFFINITY = Counter(
    "blockq_session_affinity_total",
    "Routing decisions of requests naming a session (x-session-id, or OpenAI's user), by what "
    "became of the session's previous instance: none (no previous turn remembered), kept (the "
    "policy chose it anyway), applied (moved there, within the margin), declined (too slow, or "
    "missing the latency targets), unavailable (not a candidate, or not simulated).",
    ["outcome"],
)
ENGINE_GENERATED_TOKENS = Counter(
    "blockq_engine_generated_tokens_total",
    "Output tokens an engine decoded (the decode tokens of its steps).",
    ["instance_id", "engine_kind", "model"],
)
ENGINE_PROMPT_TOKENS = Counter(
    "blockq_engine_prompt_tokens_total",
    "Prompt tokens an engine prefilled (the prefill tokens of its steps).",
    ["instance_id", "engine_kind", "model"],
)
ENGINE_STEP_DURATION = Histogram(
    "blockq_engine_step_duration_seconds",
    "Wall time of one engine step (one forward pass of the running batch).",
    ["instance_id", "engine_kind", "model"], buckets=_STEP_BUCKETS_S,
)


def observe_routing(policy: str, instance_id: str, routing: Mapping[str, Any]) -> None:
    """One committed routing decision; `routing` is the decision's record (decision_ms and,
    when the predict stage timed the request, overhead_ms)."""
    ROUTING_DECISIONS.labels(policy, instance_id).inc()
    if routing.get("decision_ms") is not None:
        ROUTING_DECISION_TIME.labels(policy).observe(routing["decision_ms"] / 1000)
    if routing.get("overhead_ms") is not None:
        ROUTING_OVERHEAD.labels(policy).observe(routing["overhead_ms"] / 1000)


def observe_held() -> None:
    ROUTING_HELD.inc()


def observe_affinity(outcome: str) -> None:
    """One committed routing decision of a request with a session."""
    SESSION_AFFINITY.labels(outcome).inc()


def observe_unfinished_targets(status: RequestStatus, kinds: Iterable[str]) -> None:
    """A request with latency targets (`kinds`: ttft and/or e2e) that ended without finishing:
    refused at routing (outcome rejected), or failed or cancelled (outcome missed). Counted once,
    after the commit of the transition that ended it (domain/request_store.py)."""
    outcome = "rejected" if status == RequestStatus.REJECTED else "missed"
    for kind in (*kinds, "all"):
        SLO_REQUESTS.labels(kind, outcome).inc()


def observe_completion(request: InferenceRequest) -> None:
    """Latencies, prediction errors and latency-target outcomes of a request that just
    succeeded (after its commit)."""
    labels = (request.instance_id or "", request.priority, request.model or "")
    finished_at = request.finished_at
    if finished_at is None:
        return
    _observe_targets(request.slo_ttft_met, request.slo_e2e_met)
    if request.first_token_at is not None:
        REQUEST_TTFT.labels(*labels).observe(
            _seconds(request.created_at, request.first_token_at))
    REQUEST_E2E.labels(*labels).observe(_seconds(request.created_at, finished_at))
    if request.predicted_output_tokens is not None and request.output_tokens is not None:
        LENGTH_PREDICTION_ERROR.observe(
            relative_error(request.predicted_output_tokens, request.output_tokens))
    if request.predicted_e2e_s is not None and request.routed_at is not None:
        actual_s = _seconds(request.routed_at, finished_at)
        if actual_s > 0:
            LATENCY_PREDICTION_ERROR.labels(request.policy or "").observe(
                abs(request.predicted_e2e_s - actual_s) / actual_s)


def _observe_targets(ttft_met: bool | None, e2e_met: bool | None) -> None:
    outcomes = {kind: met for kind, met in (("ttft", ttft_met), ("e2e", e2e_met))
                if met is not None}
    if not outcomes:
        return
    outcomes["all"] = all(outcomes.values())
    for kind, met in outcomes.items():
        SLO_REQUESTS.labels(kind, "met" if met else "missed").inc()


def _seconds(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds())


class _Step(Protocol):
    duration_ms: float
    num_prefill_tokens: int
    num_decode_tokens: int


class EngineStepMetrics:
    """The step metrics of one engine, labels bound once: `observe` runs on the engine's
    thread between two steps, so it does no more than three in-memory writes."""

    def __init__(self, instance_id: str, engine_kind: str, *, model: str = "") -> None:
        labels = (instance_id, engine_kind, model)  # model: the one the instance serves
        self._generated = ENGINE_GENERATED_TOKENS.labels(*labels)
        self._prompt = ENGINE_PROMPT_TOKENS.labels(*labels)
        self._duration = ENGINE_STEP_DURATION.labels(*labels)

    def observe(self, sample: _Step) -> None:
        self._duration.observe(sample.duration_ms / 1000)
        self._generated.inc(sample.num_decode_tokens)
        self._prompt.inc(sample.num_prefill_tokens)


# --- read when scraped -------------------------------------------------------------------------
class RequestCountCollector:
    """`blockq_requests{status, priority}`: requests in the database by current status (every
    status and priority, zeros included). Requests in flight are counted at each scrape (few
    rows, found through the status index); terminal ones, nearly the whole table, are counted
    at most every `cache_s` seconds: the counts wait in Redis for every API process (counted
    directly while Redis is unreachable)."""

    def __init__(self, db: Database, client: redis.Redis | None = None, *,
                 cache_s: float = 0.0) -> None:
        self.db = db
        self.redis = client
        self.cache_s = cache_s

    def collect(self) -> Iterator[Metric]:
        counts = {(str(s), str(p)): 0 for s in RequestStatus for p in Priority}
        counts.update(self._count(_IN_FLIGHT))
        counts.update(self._terminal_counts())
        family = GaugeMetricFamily("blockq_requests", "Requests by current status and priority.",
                                   labels=["status", "priority"])
        for (status, priority), count in sorted(counts.items()):
            family.add_metric([status, priority], count)
        yield family


    def _count(self, statuses: Sequence[str]) -> dict[tuple[str, str], int]:
        with self.db.session() as session:
            rows = session.execute(
                select(InferenceRequest.status, InferenceRequest.priority, func.count())
                .where(InferenceRequest.status.in_(statuses))
                .group_by(InferenceRequest.status, InferenceRequest.priority)
            ).all()
        return {(status, priority): count for status, priority, count in rows}

    def _terminal_counts(self) -> dict[tuple[str, str], int]:
        if self.redis is None or self.cache_s <= 0:
            return self._count(_TERMINAL)
        try:
            cached = self.redis.get(_TERMINAL_COUNTS_KEY)
        except redis.RedisError:
            return self._count(_TERMINAL)
        if cached is not None:
            return {tuple(key.split("|", 1)): count  # type: ignore[misc]
                    for key, count in json.loads(cached).items()}
        counts = self._count(_TERMINAL)
        with contextlib.suppress(redis.RedisError):
            self.redis.set(_TERMINAL_COUNTS_KEY, json.dumps(
                {f"{status}|{priority}": count for (status, priority), count in counts.items()}),
                px=max(1, int(self.cache_s * 1000)))
        return counts


_TERMINAL = sorted(str(s) for s in TERMINAL_STATUSES)
_IN_FLIGHT = sorted(str(s) for s in RequestStatus if s not in TERMINAL_STATUSES)
#: Where the terminal counts wait between two counts (RequestCountCollector).
_TERMINAL_COUNTS_KEY = "blockq:metrics:terminal_request_counts"


class QueueDepthCollector:
    """`blockq_queue_messages{queue}`: messages waiting in each Celery queue, all priorities
    (messages a worker has taken, even if not yet acknowledged, are not counted)."""

    def __init__(
        self,
        client: redis.Redis,
        queues: Callable[[], Iterable[str]],
        *,
        priority_steps: Sequence[int],
        sep: str,
    ) -> None:
        self.redis = client
        self.queues = queues
        self.priority_steps = priority_steps
        self.sep = sep

    def depths(self) -> dict[str, int]:
        by_priority = queue_depths(self.redis, sorted(set(self.queues())),
                                   priority_steps=self.priority_steps, sep=self.sep)
        return {name: sum(counts.values()) for name, counts in by_priority.items()}

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("blockq_queue_messages",
                                   "Messages waiting in a Celery queue, all priorities.",
                                   labels=["queue"])
        for name, depth in self.depths().items():
            family.add_metric([name], depth)
        yield family


class FleetCollector:
    """Each instance's published engine state: alive and heartbeat age for every registered
    instance; running, waiting, assigned and KV-cache usage for the alive ones. Labelled with
    the model each serves and its hardware (the device kind, or an emulated instance's
    execution-time model)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        labels = ["instance_id", "engine_kind", "model", "hardware"]

        def gauge(name: str, documentation: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, documentation, labels=labels)

        alive = gauge("blockq_engine_alive", "1 while the instance's heartbeat is fresh, else 0.")
        age = gauge("blockq_engine_heartbeat_age_seconds",
                    "Seconds since the instance last published its state.")
        running = gauge("blockq_engine_running_requests", "Requests in the running batch.")
        waiting = gauge("blockq_engine_waiting_requests",
                        "Requests queued in the engine, not scheduled yet (or preempted).")
        assigned = gauge("blockq_engine_assigned_requests",
                         "Requests routed to the instance that its engine does not hold yet.")
        kv_usage = gauge("blockq_engine_kv_cache_usage_ratio",
                         "Share of the engine's KV-cache blocks in use, 0 to 1.")
        for status in self.fleet.statuses():
            state = status.state
            values = [status.instance_id, state.engine_kind if state else "unknown",
                      state.model if state else "", _hardware(state)]
            alive.add_metric(values, 1 if status.alive else 0)
            if status.heartbeat_age_s is not None:
                age.add_metric(values, status.heartbeat_age_s)
            if not status.alive:
                continue  # NOTE: a dead instance's last state is stale; show no load for it
            running.add_metric(values, status.num_running)
            waiting.add_metric(values, status.num_waiting)
            assigned.add_metric(values, status.num_assigned)
            if state is not None and state.num_total_blocks > 0:
                kv_usage.add_metric(values, 1 - state.num_free_blocks / state.num_total_blocks)
        yield from (alive, age, running, waiting, assigned, kv_usage)


def _hardware(state: Any) -> str:
    """An instance's hardware label: an emulated one's execution-time model, else its device."""
    if state is None:
        return ""
    return state.exec_model or state.hardware


class FallbackCollector:
    """The bias watch's round-robin fallback (domain.length_bias.fallback_state)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def collect(self) -> Iterator[Metric]:
        state = fallback_state(self.redis)
        remaining_s = max(0.0, state["until"] - time.time()) if state else 0.0
        yield GaugeMetricFamily(
            "blockq_routing_fallback_active",
            "1 while routing falls back to round_robin because length predictions keep "
            "missing, else 0.", value=1 if state else 0)
        yield GaugeMetricFamily("blockq_routing_fallback_remaining_seconds",
                                "Seconds left of the fallback in force (0 when none).",
                                value=remaining_s)


class BatchWindowCollector:
    """The batch releaser's window (workers/batch/headroom_window.py), when it steers one."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def collect(self) -> Iterator[Metric]:
        raw = self.redis.get(BATCH_WINDOW_KEY)
        if raw is None:
            return  # headroom control off, or the releaser has not run lately
        state = json.loads(raw)
        yield GaugeMetricFamily(
            "blockq_batch_window_requests",
            "Batch requests the releaser allows in flight now: grows while interactive "
            "traffic meets batch_headroom_ttft_s, halves when it misses.",
            value=state["window"])
        if state.get("ttft_p99_s") is not None:
            yield GaugeMetricFamily(
                "blockq_batch_headroom_interactive_ttft_p99_seconds",
                "Interactive TTFT p99 over batch_headroom_window_s, as the releaser saw it.",
                value=state["ttft_p99_s"])


class BatchEtaCollector:
    """Each running batch's completion estimate (workers/batch/estimates.py): seconds left as
    estimated, and whether that meets its completion window."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def collect(self) -> Iterator[Metric]:
        remaining = GaugeMetricFamily(
            "blockq_batch_estimated_remaining_seconds",
            "Seconds until the batch's last line finishes, as last estimated (its lines' "
            "predicted lengths simulated on the fleet beside the interactive load).",
            labels=["batch_id"])
        meets = GaugeMetricFamily(
            "blockq_batch_meets_completion_window",
            "1 when the batch is estimated to finish within its completion window, else 0.",
            labels=["batch_id"])
        now = time.time()
        for raw_id, raw in self.redis.hgetall(BATCH_ETA_KEY).items():
            batch_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
            estimate = json.loads(raw)
            remaining.add_metric([batch_id],
                                 max(0.0, estimate["estimated_completion_at"] - now))
            meets.add_metric([batch_id], float(bool(estimate["meets_completion_window"])))
        yield remaining
        yield meets


class AutoscaleCollector:
    """The autoscaler's last decision per model and GPU kind, and its decision counts
    (domain/autoscale_record.py): what KEDA or an HPA scales engine Deployments on."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def collect(self) -> Iterator[Metric]:
        desired = GaugeMetricFamily(
            "blockq_desired_instances",
            "Engine instances the autoscaler wants now, per model and GPU kind (its last "
            "decision; absent while autoscaling is off).", labels=["model", "gpu_kind"])
        for row in desired_instances(self.redis):
            desired.add_metric([row.model, row.gpu_kind], row.count)
        yield desired
        decisions = CounterMetricFamily(
            "blockq_autoscale_decisions", "Autoscaling decisions by model and action (up, "
            "down, hold).", labels=["model", "action"])
        for model, action, count in decision_counts(self.redis):
            decisions.add_metric([model, action], count)
        yield decisions


class GuardedCollectors:
    """Collects each named collector; one whose database or Redis fails is left out of the
    scrape (logged, and `blockq_scrape_collector_success` says 0) instead of failing it all."""

    def __init__(self, collectors: Mapping[str, Collector]) -> None:
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        success = GaugeMetricFamily(
            "blockq_scrape_collector_success",
            "1 when the scrape-time collector read its source, 0 when it failed.",
            labels=["collector"])
        for name, collector in self.collectors.items():
            try:
                families = list(collector.collect())
            except (SQLAlchemyError, redis.RedisError):
                logger.warning("metrics collector %s failed", name, exc_info=True)
                success.add_metric([name], 0)
                continue
            success.add_metric([name], 1)
            yield from families
        yield success


class _ThisProcess:
    """This process's own pushed metrics (no multi-process directory configured)."""

    def collect(self) -> Iterator[Metric]:
        return REGISTRY.collect()


def scrape_registry(svc: Services) -> CollectorRegistry:
    """What one scrape of GET /metrics shows: the pushed metrics of every process of the host
    (or of this process alone) and the scrape-time collectors."""
    registry = CollectorRegistry()
    multiproc_dir = svc.settings.prometheus_multiproc_dir
    if multiproc_dir is not None:
        MultiProcessCollector(registry, path=str(multiproc_dir))
    else:
        registry.register(_ThisProcess())
    transport = svc.celery.conf.broker_transport_options or {}
    fleet = svc.fleet
    registry.register(GuardedCollectors({
        "requests": RequestCountCollector(svc.db, fleet.redis,
                                          cache_s=svc.settings.metrics_counts_cache_s),
        "queues": QueueDepthCollector(
            fleet.redis,
            lambda: [*SERVICE_QUEUES, *(s.instance_id for s in fleet.statuses())],
            priority_steps=transport.get("priority_steps", [0]),
            sep=transport.get("sep", ":"),
        ),
        "fleet": FleetCollector(fleet),
        "fallback": FallbackCollector(fleet.redis),
        "batch_window": BatchWindowCollector(fleet.redis),
        "batch_eta": BatchEtaCollector(fleet.redis),
        "autoscale": AutoscaleCollector(fleet.redis),
    }))
    return registry


def serve_process_metrics(settings: Settings) -> WSGIServer | None:
    """Serve this process's own metrics on settings.metrics_port (a background thread of
    prometheus_client's HTTP server); None when the port is unset."""
    if settings.metrics_port is None:
        return None
    server, _thread = start_http_server(settings.metrics_port, addr=settings.metrics_host)
    logger.info("metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)
    return server


def prepare_multiproc_dir(path: Path, *, wipe: bool) -> Path:
    """The multi-process directory, created; `wipe` deletes the files of earlier runs (do it
    only while no process of the host writes there)."""
    path.mkdir(parents=True, exist_ok=True)
    if wipe:
        for stale in path.glob("*.db"):
            stale.unlink()
    return path.resolve()
