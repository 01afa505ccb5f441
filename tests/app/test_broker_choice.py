"""The broker choice (BLOCKQ_BROKER_URL): Redis by default with its priority lists; RabbitMQ with
quorum queues on topic exchanges (which native delayed delivery needs for countdowns)."""

from __future__ import annotations

import pytest
from celery import Celery

from domain.celery_app import create_celery
from domain.settings import Settings

AMQP = "amqp://guest:guest@127.0.0.1:5672//"


def test_redis_stays_the_default_broker_with_its_priority_lists() -> None:
    settings = Settings(redis_url="redis://127.0.0.1:6379/3")
    celery = create_celery(settings, set_as_current=False)
    assert not settings.broker_is_rabbitmq
    assert celery.conf.broker_url == "redis://127.0.0.1:6379/3"
    assert celery.conf.broker_transport_options["queue_order_strategy"] == "priority"
    assert celery.amqp.queues["gpu.0"].queue_arguments in (None, {})


def test_rabbitmq_declares_every_queue_quorum_on_a_topic_exchange() -> None:
    settings = Settings(broker_url=AMQP, redis_url="redis://127.0.0.1:6379/3")
    celery = create_celery(settings, set_as_current=False)
    assert settings.broker_is_rabbitmq and celery.conf.broker_url == AMQP
    # Engine queues are named at run time (the instance id): declared like the named ones.
    for queue in ("predict", "route", "webhooks", "batches", "gpu.7"):
        declared = celery.amqp.queues[queue]
        assert declared.queue_arguments == {"x-queue-type": "quorum"}, queue
        assert declared.exchange.type == "topic", queue
    assert celery.conf.broker_transport_options == {"confirm_publish": True}
    assert celery.conf.worker_detect_quorum_queues is True
    assert celery.conf.broker_heartbeat == 10  # a partitioned worker's old connection goes


def test_rabbitmq_countdowns_are_whole_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Native delayed delivery counts whole seconds; Celery fails one under a second."""
    celery = create_celery(Settings(broker_url=AMQP), set_as_current=False)
    sent: list[float | None] = []
    monkeypatch.setattr(Celery, "send_task",
                        lambda self, *args, countdown=None, **options: sent.append(countdown))
    for countdown in (0.2, 1.5, 3, None, 0):
        celery.send_task("webhooks.deliver", args=["req_1", "request.succeeded"],
                         countdown=countdown)
    assert sent == [1, 2, 3, None, 0]
