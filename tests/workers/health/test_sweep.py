"""The stranded-request sweep: what it decides for each request in flight (pure), and what it
does on the real PostgreSQL and Redis when a message was lost or an engine dropped a request."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from unittest.mock import patch

import pytest
from sqlalchemy import select, update

from domain import dispatch, request_store
from domain.models import InferenceRequest, RequestStatus, WebhookDelivery
from domain.queues import UNACKED_INDEX_KEY, UNACKED_KEY, request_ids_in_broker
from tests.engine_states import engine_state, waiting_request
from workers.health.sweep import Findings, InFlight, Remedy, Sweep, diagnose
from workers.health.undelivered import WebhookPolicy
from workers.runtime import Runtime

#: A webhook attempt is due 1 s after the previous one (doubling), at most 3 attempts.
WEBHOOKS = WebhookPolicy(backoff_s=1.0, max_attempts=3, grace_s=0.0)
QUEUED, PREDICTING = RequestStatus.QUEUED, RequestStatus.PREDICTING
ROUTED, RUNNING = RequestStatus.ROUTED, RequestStatus.RUNNING


def in_flight(request_id: str, status: RequestStatus, instance_id: str | None = None,
              predicted: bool = False) -> InFlight:
    return InFlight(request_id, status, instance_id, 1, 0, predicted)


def no_messages_asked() -> set[str]:
    raise AssertionError("the broker was scanned although no request needed it")


def test_work_of_an_instance_without_heartbeat_is_rerouted_at_once() -> None:
    findings = diagnose([in_flight("a", RUNNING, "gpu.0"), in_flight("b", ROUTED, "gpu.0")],
                        {"gpu.1": set()}, no_messages_asked)
    assert findings == Findings({"a": Remedy.REROUTE, "b": Remedy.REROUTE}, {})


def test_running_work_its_live_engine_does_not_hold_is_suspected() -> None:
    findings = diagnose([in_flight("held", RUNNING, "gpu.0"), in_flight("lost", RUNNING, "gpu.0")],
                        {"gpu.0": {"held"}}, no_messages_asked)
    assert findings == Findings({}, {"lost": Remedy.REROUTE})


def test_work_waiting_for_a_message_is_suspected_only_without_one() -> None:
    requests = [in_flight("q", QUEUED), in_flight("p", PREDICTING, predicted=True),
                in_flight("r", ROUTED, "gpu.0"), in_flight("q2", QUEUED)]
    findings = diagnose(requests, {"gpu.0": set()}, lambda: {"q2"})
    assert findings == Findings({}, {"q": Remedy.RESEND, "p": Remedy.RESEND,
                                     "r": Remedy.RESEND})


@pytest.mark.parametrize(("stranded", "task", "queue"), [
    (in_flight("req_q", QUEUED), dispatch.TASK_PREDICT, "predict"),
    (in_flight("req_p", PREDICTING, predicted=True), dispatch.TASK_ROUTE, "route"),
    (in_flight("req_r", ROUTED, "gpu.3"), dispatch.TASK_GENERATE, "gpu.3"),
])
def test_a_resend_is_the_message_its_stage_waits_for(stranded: InFlight, task: str,
                                                      queue: str) -> None:
    message = stranded.next_message()
    assert (message.task, message.queue, message.args[0]) == (task, queue, stranded.id)


def test_a_webhook_attempt_is_overdue_after_its_backoff_until_attempts_run_out() -> None:
    now = datetime.now(UTC)
    assert WEBHOOKS.overdue(0, now - timedelta(seconds=0.1), now)  # never tried
    assert not WEBHOOKS.overdue(2, now - timedelta(seconds=1.5), now)  # next one due at 2 s
    assert WEBHOOKS.overdue(2, now - timedelta(seconds=2.5), now)
    assert not WEBHOOKS.overdue(3, now - timedelta(hours=1), now)  # gave up


# --- on PostgreSQL and Redis --------------------------------------------------------------------

def sweep_of(rt: Runtime) -> Sweep:
    return Sweep(rt.outbox, rt.fleet, rt.redis, WEBHOOKS, stranded_after_s=0,
                 unacked_fresh_s=30, memory_s=60)


def in_broker(rt: Runtime, *queues: str) -> set[str]:
    return request_ids_in_broker(rt.redis, queues, fresh_s=30)


def test_a_lost_message_is_sent_again_once_two_sweeps_found_it_missing(
    rt: Runtime, routed_request: Callable[..., str], request_status: Callable[[str], str]
) -> None:
    lost = routed_request("gpu.0", 0, QUEUED)  # queued; its predict message is gone
    waiting = routed_request("gpu.0", 0, QUEUED)
    dispatch.predict(waiting, priority=0).send(rt.celery)  # still in the broker
    rt.fleet.publish("gpu.0", engine_state())

    first = sweep_of(rt).run()
    assert (first.resent, first.suspected) == (0, 1)
    second = sweep_of(rt).run()
    assert (second.resent, second.rerouted) == (1, 0)
    assert in_broker(rt, "predict") == {lost, waiting}
    assert request_status(lost) == QUEUED
    assert sweep_of(rt).run().suspected == 0  # its message is there now


def test_running_work_its_engine_lost_goes_back_to_routing(
    rt: Runtime, routed_request: Callable[..., str], request_status: Callable[[str], str]
) -> None:
    held = routed_request("gpu.0", 1, RUNNING)
    lost = routed_request("gpu.0", 1, RUNNING)  # e.g. the worker restarted within the TTL
    rt.fleet.publish("gpu.0", engine_state(waiting_request(held, 3, None)))

    assert sweep_of(rt).run().rerouted == 0
    assert sweep_of(rt).run().rerouted == 1
    assert (request_status(held), request_status(lost)) == (RUNNING, QUEUED)
    assert in_broker(rt, "route") == {lost}


def test_a_sweep_does_not_undo_a_change_made_since_it_looked(
    rt: Runtime, routed_request: Callable[..., str], request_status: Callable[[str], str]
) -> None:
    lost = routed_request("gpu.0", 1, RUNNING)
    rt.fleet.publish("gpu.0", engine_state())
    sweep_of(rt).run()
    with rt.db.session() as session:  # meanwhile re-routed to gpu.1 as attempt 2
        session.execute(update(InferenceRequest).where(InferenceRequest.id == lost)
                        .values(instance_id="gpu.1", attempt=2))
    rt.fleet.publish("gpu.1", engine_state())
    sweep_of(rt).run()  # suspects it again, as attempt 2 on gpu.1: a first sighting
    with rt.db.session() as session:
        row = session.execute(select(InferenceRequest.status, InferenceRequest.attempt)
                              .where(InferenceRequest.id == lost)).one()
    assert tuple(row) == (RUNNING, 2)


def finish(rt: Runtime, request_id: str, **values: object) -> None:
    with rt.db.session() as session:
        session.execute(update(InferenceRequest).where(InferenceRequest.id == request_id)
                        .values(status=RequestStatus.SUCCEEDED,
                                finished_at=datetime.now(UTC) - timedelta(minutes=1), **values))


def test_an_undelivered_webhook_whose_message_was_lost_is_sent_again(
    rt: Runtime, routed_request: Callable[..., str]
) -> None:
    lost = routed_request("gpu.0", 1)
    finish(rt, lost, webhook_url="http://127.0.0.1:9/hook")
    delivered = routed_request("gpu.0", 1)
    finish(rt, delivered, webhook_url="http://127.0.0.1:9/hook")
    with rt.db.session() as session:
        session.add(WebhookDelivery(request_id=delivered, event_id="msg_x", attempt=1,
                                    event_type="request.succeeded", url="http://127.0.0.1:9/",
                                    status_code=200, succeeded=True, duration_ms=1.0))

    assert sweep_of(rt).run().webhooks_resent == 0  # a first sighting
    assert sweep_of(rt).run().webhooks_resent == 1
    assert in_broker(rt, "webhooks") == {lost}


def test_assignments_of_decisions_never_committed_are_forgotten(
    rt: Runtime, routed_request: Callable[..., str]
) -> None:
    routed = routed_request("gpu.0", 1)
    abandoned = routed_request("gpu.0", 0, QUEUED)  # its router died before the commit
    rt.fleet.publish("gpu.0", engine_state())
    for request_id in (routed, abandoned):
        rt.fleet.assign("gpu.0", request_id, num_prompt_tokens=3, predicted_output_tokens=8)
    time.sleep(0.01)

    assert sweep_of(rt).run().cleaned == 1
    assert [a.request_id for a in rt.fleet.statuses()[0].assigned] == [routed]


def test_messages_a_dead_worker_held_about_finished_or_no_work_are_dropped(
    rt: Runtime, routed_request: Callable[..., str]
) -> None:
    done, running = routed_request("gpu.0", 1), routed_request("gpu.0", 1, RUNNING)
    finish(rt, done)
    rt.fleet.publish("gpu.0", engine_state(waiting_request(running, 3, None)))
    taken_at = time.time() - 120  # by a worker killed two minutes ago
    for tag, args in ((b"t1", f"('{done}',)"), (b"t2", f"('{running}',)"), (b"t3", "()")):
        rt.redis.zadd(UNACKED_INDEX_KEY, {tag: taken_at})
        rt.redis.hset(UNACKED_KEY, tag, json.dumps([{"headers": {"argsrepr": args}}, "", "q"]))

    assert sweep_of(rt).run().cleaned == 2  # the finished request's, and a periodic task's
    assert rt.redis.hkeys(UNACKED_KEY) == [b"t2"]


# --- clocks of several hosts ---------------------------------------------------------------------

def skewed(offset_s: float) -> Callable[[], datetime]:
    return lambda: datetime.now(UTC) + timedelta(seconds=offset_s)


@pytest.mark.parametrize("skewed_clock", [
    "domain.request_store.utcnow",  # the engine host that marked it running runs 30 s behind
    "workers.health.sweep.utcnow",  # the sweep's host runs 30 s ahead
])
def test_work_just_started_is_not_taken_for_stranded_when_a_clock_is_30s_off(
    rt: Runtime, routed_request: Callable[..., str], request_status: Callable[[str], str],
    skewed_clock: str,
) -> None:
    started = routed_request("gpu.0", 1)
    offset_s = -30.0 if skewed_clock.startswith("domain.") else 30.0
    with patch(skewed_clock, skewed(offset_s)):
        with rt.db.session() as session:
            assert request_store.transition(session, started, RUNNING, allowed_from=[ROUTED])
        rt.fleet.publish("gpu.0", engine_state())  # its admission not published yet
        sweep = Sweep(rt.outbox, rt.fleet, rt.redis, WEBHOOKS, stranded_after_s=5,
                      unacked_fresh_s=30, memory_s=60)
        reports = [sweep.run(), sweep.run()]
    assert [(r.suspected, r.rerouted) for r in reports] == [(0, 0), (0, 0)]
    assert request_status(started) == RUNNING


def test_work_unchanged_past_the_cutoff_by_the_database_clock_is_swept(
    rt: Runtime, routed_request: Callable[..., str], request_status: Callable[[str], str]
) -> None:
    lost = routed_request("gpu.0", 1, RUNNING)
    rt.fleet.publish("gpu.0", engine_state())
    time.sleep(0.3)
    sweep = Sweep(rt.outbox, rt.fleet, rt.redis, WEBHOOKS, stranded_after_s=0.2,
                  unacked_fresh_s=30, memory_s=60)
    assert [sweep.run().rerouted, sweep.run().rerouted] == [0, 1]
    assert request_status(lost) == QUEUED
