"""The stranded-request sweep: what it decides for each request in flight (pure), and what it
does on the real PostgreSQL and Redis when a message was lost or an engine dropped a request."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import select, update

from app import dispatch
from app.models import InferenceRequest, RequestStatus
from app.queues import request_ids_in_broker
from tests.engine_states import engine_state, waiting_request
from workers.health.sweep import Findings, InFlight, Remedy, Sweep, diagnose
from workers.runtime import Runtime

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


# --- on PostgreSQL and Redis --------------------------------------------------------------------

def sweep_of(rt: Runtime) -> Sweep:
    return Sweep(rt.outbox, rt.fleet, rt.redis, stranded_after_s=0, unacked_fresh_s=30,
                 memory_s=60)


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
