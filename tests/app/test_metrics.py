"""The scrape-time collectors and GET /metrics against the real Redis (db 15) and PostgreSQL."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest
import redis
from flask import Flask
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis.backoff import NoBackoff
from redis.retry import Retry

from app import create_app
from domain.batches import BATCH_WINDOW_KEY
from domain.celery_app import create_celery
from domain.length_bias import BiasRule, BiasWatch
from domain.live_fleet import Fleet
from domain.metrics import (
    BatchWindowCollector,
    EngineStepMetrics,
    FallbackCollector,
    FleetCollector,
    GuardedCollectors,
    QueueDepthCollector,
    serve_process_metrics,
)
from domain.queues import queue_keys
from domain.services import Services
from domain.settings import Settings
from domain.teams import ensure_team_key
from tests.engine_states import engine_state
from tests.environment import TEST_REDIS_URL, free_port

pytestmark = pytest.mark.services

STEPS = list(range(10))


@pytest.fixture
def client(empty_redis: redis.Redis) -> redis.Redis:
    return empty_redis


def samples(*collectors: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value of everything the collectors yield."""
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(collector)  # type: ignore[arg-type]
    return parse(generate_latest(registry).decode())


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def services_of(app: Flask) -> Services:
    return app.extensions["blockq"]


def depth_of(client: redis.Redis, *queues: str) -> dict[str, int]:
    collector = QueueDepthCollector(client, lambda: queues, priority_steps=STEPS, sep=":")
    return collector.depths()


def test_queue_keys_follow_kombus_priority_naming() -> None:
    assert queue_keys("gpu.0", priority_steps=STEPS, sep=":") == [
        "gpu.0", *(f"gpu.0:{p}" for p in range(1, 10))]
    assert queue_keys("predict", priority_steps=[0, 3, 6, 9], sep="\x06\x16") == [
        "predict", "predict\x06\x163", "predict\x06\x166", "predict\x06\x169"]


def test_depth_adds_up_every_priority_sub_queue(client: redis.Redis) -> None:
    client.rpush("route", "a", "b")
    client.rpush("route:1", "c")
    client.rpush("route:9", "d", "e", "f")
    client.rpush("routes", "not this queue")
    client.rpush("gpu.1:1", "g")
    assert depth_of(client, "route", "gpu.1", "predict") == {"route": 6, "gpu.1": 1, "predict": 0}


def test_depth_counts_what_celery_sends_with_blockqs_broker_options(client: redis.Redis) -> None:
    """Messages sent by the real Celery app (priorities 0 and 1, as the API and workers send
    them) land in lists the collector counts, and in no list it does not."""
    celery = create_celery(Settings(redis_url=TEST_REDIS_URL))
    options = celery.conf.broker_transport_options
    for priority in (0, 1, 1, 5):
        celery.send_task("predict.annotate", args=["req_x"], queue="predict", priority=priority)
    celery.send_task("serve.generate", args=["req_y", 1], queue="gpu.3", priority=1)
    collector = QueueDepthCollector(client, lambda: ["predict", "gpu.3", "route"],
                                    priority_steps=options["priority_steps"], sep=options["sep"])
    assert collector.depths() == {"gpu.3": 1, "predict": 4, "route": 0}
    lists = {key.decode() for key in client.keys("*") if client.type(key) == b"list"}
    counted = {key for queue in ("predict", "gpu.3")
               for key in queue_keys(queue, priority_steps=options["priority_steps"],
                                     sep=options["sep"])}
    assert lists and lists <= counted
    assert samples(collector)[("blockq_queue_messages", (("queue", "predict"),))] == 4


def test_fleet_collector_reports_published_states(client: redis.Redis) -> None:
    fleet = Fleet(client, heartbeat_ttl_s=30)
    fleet.publish("gpu.0", engine_state(num_running=3, num_waiting=2, num_total_blocks=100,
                                        num_free_blocks=25))
    fleet.publish("gpu.1", engine_state(num_running=9, num_waiting=9, num_total_blocks=100,
                                        num_free_blocks=0))
    fleet.mark_stopped("gpu.1")
    fleet.assign("gpu.0", "req_a", num_prompt_tokens=5, predicted_output_tokens=7)
    got = samples(FleetCollector(fleet))
    gpu0 = (("engine_kind", "emulated"), ("hardware", ""), ("instance_id", "gpu.0"),
            ("model", "emulated/qwen2-7b-a30"))
    gpu1 = (("engine_kind", "emulated"), ("hardware", ""), ("instance_id", "gpu.1"),
            ("model", "emulated/qwen2-7b-a30"))
    assert got[("blockq_engine_alive", gpu0)] == 1 and got[("blockq_engine_alive", gpu1)] == 0
    assert got[("blockq_engine_running_requests", gpu0)] == 3
    assert got[("blockq_engine_waiting_requests", gpu0)] == 2
    assert got[("blockq_engine_assigned_requests", gpu0)] == 1
    assert got[("blockq_engine_kv_cache_usage_ratio", gpu0)] == pytest.approx(0.75)
    assert 0 <= got[("blockq_engine_heartbeat_age_seconds", gpu0)] < 30
    # A dead instance's last state is stale: no load is shown for it.
    assert ("blockq_engine_running_requests", gpu1) not in got


def test_fallback_collector_follows_the_bias_watch(client: redis.Redis) -> None:
    assert samples(FallbackCollector(client))[("blockq_routing_fallback_active", ())] == 0
    watch = BiasWatch(client, BiasRule(window=3, threshold=0.5, fallback_s=60))
    for _ in range(3):
        watch.observe("m", predicted=100, actual=10)
    got = samples(FallbackCollector(client))
    assert got[("blockq_routing_fallback_active", ())] == 1
    assert 50 < got[("blockq_routing_fallback_remaining_seconds", ())] <= 60


def test_a_failing_source_leaves_the_rest_of_the_scrape() -> None:
    # No retries: redis-py retries a refused connection with backoff (about 5 s a call).
    unreachable = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2,
                              retry=Retry(NoBackoff(), 0))
    working = redis.Redis.from_url(TEST_REDIS_URL)
    got = samples(GuardedCollectors({"fallback": FallbackCollector(unreachable),
                            "queues": QueueDepthCollector(working, lambda: ["predict"],
                                                          priority_steps=STEPS, sep=":")}))
    assert got[("blockq_scrape_collector_success", (("collector", "fallback"),))] == 0
    assert got[("blockq_scrape_collector_success", (("collector", "queues"),))] == 1
    assert ("blockq_queue_messages", (("queue", "predict"),)) in got
    assert ("blockq_routing_fallback_active", ()) not in got


def test_metrics_endpoint_needs_no_key_and_counts_what_the_api_did(
    fresh_services: Settings,
) -> None:
    app = create_app(fresh_services)
    app.testing = True
    http = app.test_client()
    before = http.get("/metrics")
    assert before.status_code == 200 and before.mimetype == "text/plain"
    queued = ("blockq_requests", (("priority", "interactive"), ("status", "queued")))
    predict_depth = ("blockq_queue_messages", (("queue", "predict"),))
    assert parse(before.text)[queued] == 0 and parse(before.text)[predict_depth] == 0

    with services_of(app).db.session() as session:
        key = ensure_team_key(session, "tests").key
    response = http.post("/v1/requests", json={"prompt": "Hi", "max_tokens": 4},
                         headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 202
    after = parse(http.get("/metrics").text)
    # Nothing consumes in this test: the request waits in the predict queue.
    assert after[queued] == 1 and after[predict_depth] == 1
    assert all(value == 1 for (name, _), value in after.items()
               if name == "blockq_scrape_collector_success")


def test_a_worker_serves_its_own_metrics_when_given_a_port() -> None:
    assert serve_process_metrics(Settings()) is None
    settings = Settings(metrics_port=free_port())
    server = serve_process_metrics(settings)
    assert server is not None
    try:
        EngineStepMetrics("gpu.test", "emulated", model="tiny").observe(
            SimpleNamespace(duration_ms=12.0, num_prefill_tokens=30, num_decode_tokens=4))
        text = httpx.get(f"http://127.0.0.1:{settings.metrics_port}/metrics", timeout=5).text
    finally:
        server.shutdown()
        server.server_close()
    got = parse(text)
    labels = (("engine_kind", "emulated"), ("instance_id", "gpu.test"), ("model", "tiny"))
    assert got[("blockq_engine_generated_tokens_total", labels)] >= 4
    assert got[("blockq_engine_step_duration_seconds_count", labels)] >= 1


def test_batch_window_collector_shows_the_releasers_last_round(client: redis.Redis) -> None:
    client.delete(BATCH_WINDOW_KEY)
    assert samples(BatchWindowCollector(client)) == {}  # headroom control off
    client.set(BATCH_WINDOW_KEY, json.dumps({"window": 12.0, "num_waiting": 3,
                                             "ttft_p99_s": 0.8}))
    got = samples(BatchWindowCollector(client))
    assert got[("blockq_batch_window_requests", ())] == 12.0
    assert got[("blockq_batch_headroom_interactive_ttft_p99_seconds", ())] == 0.8
