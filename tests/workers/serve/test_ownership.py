"""The engine's ownership check on the real PostgreSQL and Redis: a request this instance runs
that the database gives to another attempt, or cancelled, is aborted here, and this run writes
nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import select, update

from domain.models import InferenceRequest, RequestStatus
from workers.runtime import Runtime
from workers.serve.emulated_engine import EmulatedEngine, EmulatedEngineConfig
from workers.serve.engine import EngineListener
from workers.serve.host import EngineHost
from workers.sim import ExecModel

#: 200 ms a step: a 16-token request runs for about 3 s, long enough to be caught running.
SLOW_GPU = ExecModel("slow", (), {"const": 200.0})


@pytest.fixture
def host(rt: Runtime) -> Iterator[EngineHost]:
    def make_engine(listener: EngineListener) -> EmulatedEngine:
        return EmulatedEngine(EmulatedEngineConfig(exec_model=SLOW_GPU, time_scale=1.0,
                                                   noise=0.0), listener=listener)

    engine_host = EngineHost("gpu.0", make_engine, rt)
    engine_host.start()
    yield engine_host
    engine_host.stop()


def run_in_background(host: EngineHost, request_id: str) -> threading.Thread:
    """`host.run` on a thread, returned once the engine runs the request."""
    thread = threading.Thread(target=host.run, args=(request_id, 1))
    thread.start()
    deadline = time.monotonic() + 10
    while request_id not in host.attempts.snapshot():
        assert time.monotonic() < deadline, "never admitted"
        time.sleep(0.01)
    return thread


def row_of(rt: Runtime, request_id: str) -> tuple[str, str | None, int, str | None]:
    r = InferenceRequest
    with rt.db.session() as session:
        return tuple(session.execute(select(r.status, r.instance_id, r.attempt, r.output_text)
                                     .where(r.id == request_id)).one())  # type: ignore[return-value]


def test_a_request_rerouted_elsewhere_is_aborted_here_and_this_run_writes_nothing(
    rt: Runtime, host: EngineHost, routed_request: Callable[..., str]
) -> None:
    request_id = routed_request("gpu.0", 1)
    thread = run_in_background(host, request_id)
    assert host.ownership.check_once() == []  # still ours

    with rt.db.session() as session:  # the sweep gave it to gpu.1 as attempt 2
        session.execute(update(InferenceRequest).where(InferenceRequest.id == request_id)
                        .values(instance_id="gpu.1", attempt=2))
    assert host.ownership.check_once() == [request_id]
    thread.join(timeout=10)

    assert not thread.is_alive()
    assert row_of(rt, request_id) == (RequestStatus.RUNNING, "gpu.1", 2, None)
    assert host.attempts.snapshot() == {}


def test_a_cancelled_request_is_aborted_even_if_its_cancel_flag_never_came(
    rt: Runtime, host: EngineHost, routed_request: Callable[..., str]
) -> None:
    request_id = routed_request("gpu.0", 1)
    thread = run_in_background(host, request_id)
    with rt.db.session() as session:  # cancelled while Redis was down: no flag for the engine
        session.execute(update(InferenceRequest).where(InferenceRequest.id == request_id)
                        .values(status=RequestStatus.CANCELLED))
    assert host.ownership.check_once() == [request_id]
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert row_of(rt, request_id)[0] == RequestStatus.CANCELLED


def test_a_request_rerouted_back_here_runs_again_after_its_earlier_attempt_is_aborted(
    rt: Runtime, host: EngineHost, routed_request: Callable[..., str]
) -> None:
    request_id = routed_request("gpu.0", 1)
    first = run_in_background(host, request_id)
    with rt.db.session() as session:  # re-routed, and back to gpu.0 as attempt 2
        session.execute(update(InferenceRequest).where(InferenceRequest.id == request_id)
                        .values(status=RequestStatus.ROUTED, attempt=2))
    host.run(request_id, 2)
    first.join(timeout=10)

    status, instance_id, attempt, output = row_of(rt, request_id)
    assert (status, instance_id, attempt) == (RequestStatus.SUCCEEDED, "gpu.0", 2)
    assert output
