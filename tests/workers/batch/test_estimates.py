"""A batch's completion estimate against the real PostgreSQL and Redis: made from its lines'
predicted lengths when it is validated, shown in the Batch object and /metrics, flagged when
the completion window cannot be met, forgotten once the batch stops."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from app.cli.client import completion_estimate_line
from domain import batches, dispatch
from domain.batches import BATCH_ETA_KEY, BATCH_WINDOW_KEY
from domain.celery_app import create_celery
from domain.file_bytes import file_store
from domain.file_records import new_file_id, register_file
from domain.metrics import BatchEtaCollector
from domain.models import Batch, BatchStatus, InferenceRequest, RequestStatus, Team, utcnow
from domain.settings import Settings
from domain.teams import create_team
from tests.engine_states import engine_state
from tests.workers.request_rows import new_request
from workers.batch import eta
from workers.batch.estimates import (
    _calibration,
    dispatch_delay,
    estimate_batch,
    interactive_load,
    refresh_estimates,
    tokens_made,
)
from workers.batch.expand import Expansion, expand
from workers.batch.release import release
from workers.predict import stage
from workers.runtime import Runtime
from workers.sim.engine_state import RequestState

pytestmark = pytest.mark.services

CHAT = "/v1/chat/completions"


@pytest.fixture
def rt(fresh_services: Settings) -> Iterator[Runtime]:
    runtime = Runtime(fresh_services.model_copy(update={
        "max_batch_in_flight": 64, "length_predictor": "learned", "engine_kind": "emulated",
        "num_instances": 2, "emulated_exec_model": "qwen2-7b-a30", "max_model_len": 4096}))
    yield runtime
    runtime.db.dispose()


def _validated_batch(rt: Runtime, texts: list[str], *, window_s: float = 86_400.0) -> str:
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": CHAT,
              "body": {"model": rt.settings.model_name, "max_tokens": 2000,
                       "messages": [{"role": "user", "content": text}]}}
             for i, text in enumerate(texts)]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    file_id = new_file_id()
    file_store(rt.settings).path(file_id).write_bytes(content)
    with rt.db.session() as session:
        team = session.scalar(select(Team).where(Team.name == "acme")) or create_team(
            session, "acme")
        register_file(session, file_id=file_id, team_id=team.id, purpose="batch",
                      filename="in.jsonl", size_bytes=len(content))
        batch = Batch(id=batches.new_batch_id(), team_id=team.id, endpoint=CHAT,
                      input_file_id=file_id, completion_window="24h",
                      expires_at=utcnow() + timedelta(seconds=window_s))
        session.add(batch)
    assert expand(rt, batch.id) is Expansion.STARTED
    return batch.id


def _shown(rt: Runtime, batch_id: str) -> dict[str, Any]:
    with rt.db.session() as session:
        batch = session.get(Batch, batch_id)
        counts = batches.line_counts(session, [batch_id])[batch_id]
        return batches.batch_to_dict(batch, counts, batches.batch_estimates(
            rt.redis, [batch_id]).get(batch_id))


def test_a_validated_batch_gets_an_estimate_from_its_lines_predicted_lengths(
        rt: Runtime) -> None:
    essays = _validated_batch(rt, [f"Write a long, detailed essay on the history of {topic}, "
                                   "with sections and sources." for topic in TOPICS])
    labels = _validated_batch(rt, [f"Answer with one word, yes or no: is {topic} a fruit?"
                                   for topic in TOPICS])
    assert _shown(rt, essays)["blockq"]["estimated_completion_at"] is None  # none yet

    now = utcnow()
    long_eta, short_eta = estimate_batch(rt, essays, now=now), estimate_batch(rt, labels, now=now)

    # The same line count, unlike answers: the accurate head's lengths tell them apart.
    assert long_eta.remaining_lines == short_eta.remaining_lines == len(TOPICS)
    assert long_eta.estimated_completion_at > short_eta.estimated_completion_at
    assert long_eta.meets_completion_window and short_eta.meets_completion_window
    shown = _shown(rt, essays)["blockq"]
    assert shown["estimated_completion_at"] == long_eta.estimated_completion_at
    assert shown["estimated_at"] == int(now.timestamp()) and shown["meets_completion_window"]
    assert "within its completion window" in completion_estimate_line(_shown(rt, essays))

    families = {f.name: f for f in BatchEtaCollector(rt.redis).collect()}
    remaining = {s.labels["batch_id"]: s.value
                 for s in families["blockq_batch_estimated_remaining_seconds"].samples}
    assert remaining[essays] > remaining[labels] >= 0
    assert {s.labels["batch_id"]: s.value for s in families[
        "blockq_batch_meets_completion_window"].samples} == {essays: 1.0, labels: 1.0}


def test_a_window_the_fleet_cannot_meet_is_flagged_with_the_estimate(rt: Runtime) -> None:
    batch_id = _validated_batch(rt, [f"Write a long essay about {t}." for t in TOPICS],
                                window_s=0.5)
    record = estimate_batch(rt, batch_id)
    assert not record.meets_completion_window
    assert _shown(rt, batch_id)["blockq"]["meets_completion_window"] is False
    assert "AFTER its completion window" in completion_estimate_line(_shown(rt, batch_id))


def test_estimates_follow_running_batches_and_are_forgotten_when_they_stop(
        rt: Runtime) -> None:
    running = _validated_batch(rt, ["Summarise the plot of Hamlet."] * 3)
    stopped = _validated_batch(rt, ["Name a colour."] * 3)
    refresh_estimates(rt)
    assert set(batches.batch_estimates(rt.redis, [running, stopped])) == {running, stopped}
    with rt.db.session() as session:
        session.get(Batch, stopped).status = BatchStatus.CANCELLED
    assert set(refresh_estimates(rt)) == {running}
    assert rt.redis.hexists(BATCH_ETA_KEY, running) and not rt.redis.hexists(
        BATCH_ETA_KEY, stopped)
    assert _shown(rt, stopped)["blockq"]["estimated_completion_at"] is None
    assert estimate_batch(rt, stopped) is None



def test_a_batch_whose_lines_are_still_being_read_gets_no_estimate(rt: Runtime) -> None:
    """While validating, only the lines read so far are in the database: an estimate of them
    would promise the whole batch far too soon."""
    reading = _validated_batch(rt, ["Write an essay on tea."] * 3)
    with rt.db.session() as session:
        session.get(Batch, reading).status = BatchStatus.VALIDATING
    assert estimate_batch(rt, reading) is None
    assert reading not in refresh_estimates(rt)
    assert not rt.redis.hexists(BATCH_ETA_KEY, reading)


TOPICS = ("tea", "rivers", "the moon", "compilers", "bees", "jazz", "glaciers", "chess")


def test_the_estimates_run_on_the_bulk_predictor_and_beat_repeats_them() -> None:
    """Where the accurate head is loaded already; a batch is estimated again as it runs."""
    celery = create_celery(Settings(), set_as_current=False)
    for task in (dispatch.TASK_BATCH_ESTIMATE, dispatch.TASK_BATCH_ESTIMATES):
        assert celery.amqp.router.route({}, task)["queue"].name == dispatch.QUEUE_PREDICT_BULK
    assert celery.amqp.router.route({}, dispatch.TASK_PREDICT)["queue"].name == "predict"
    entry = celery.conf.beat_schedule["estimate-batches"]
    assert entry["task"] == dispatch.TASK_BATCH_ESTIMATES
    assert entry["schedule"] == Settings().batch_eta_interval_s


def test_pending_lines_are_predicted_once_across_rounds(rt: Runtime) -> None:
    """Beat estimates every running batch each round: its pending lines' lengths are kept."""
    batch_id = _validated_batch(rt, [f"Describe {topic} in two lines." for topic in TOPICS])
    learned = stage.learned_lengths(rt, stage.HEAD_ACCURATE)
    calls: list[int] = []
    predict_many = learned.predict_many

    def counted(queries: Any) -> Any:
        calls.append(len(queries))
        return predict_many(queries)

    learned.predict_many = counted  # type: ignore[method-assign]
    first, again = estimate_batch(rt, batch_id), estimate_batch(rt, batch_id)
    assert calls == [len(TOPICS)] and again.remaining_lines == first.remaining_lines


def test_a_running_line_is_estimated_from_the_tokens_its_engine_says_it_made(
        rt: Runtime) -> None:
    """Released lines predicted at 200 tokens that have made 190 each, as their engine's
    published state says: the batch is nearly done, not about to start over."""
    batch_id = _validated_batch(rt, [f"Describe {topic}, item {i}." for i in range(30)
                                     for topic in TOPICS[:1]])
    assert release(rt).released
    with rt.db.session() as session:
        model = session.get(Batch, batch_id).model
        ids = list(session.scalars(select(InferenceRequest.id).where(
            InferenceRequest.batch_id == batch_id)))
        session.execute(update(InferenceRequest).where(InferenceRequest.batch_id == batch_id)
                        .values(predicted_output_tokens=200, predicted_output_tokens_p90=None))
    before = estimate_batch(rt, batch_id)
    running = [RequestState(i, 100, num_computed_tokens=290, num_output_tokens=190,
                            predicted_output_tokens=200, is_running=True) for i in ids]
    rt.fleet.publish("gpu.0", engine_state(*running, model=model))
    # Another model's engine is not read (its request ids are not the batch's lines).
    rt.fleet.publish("gpu.1", engine_state(dataclasses.replace(running[0], num_output_tokens=7),
                                           model="other"))
    assert tokens_made(rt, model) == dict.fromkeys(ids, 190)
    after = estimate_batch(rt, batch_id)
    assert before and after and before.lines_per_s and after.lines_per_s
    assert after.remaining_lines == before.remaining_lines == len(ids)
    left_before = before.remaining_lines / before.lines_per_s
    left_after = after.remaining_lines / after.lines_per_s
    assert left_after < 0.5 * left_before


def test_a_batchs_first_finished_lines_correct_the_rest_of_its_lengths(rt: Runtime) -> None:
    """The first 24 released lines answered in half their predicted lengths (and one failed,
    which tells nothing): the rest of the batch is expected to run short too, so its estimate
    drops, where the lines finished out of order after a running one do not count."""
    batch_id = _validated_batch(rt, [f"Describe {topic}, item {i}, in two short paragraphs."
                                     for i in range(40) for topic in TOPICS[:1]])
    assert release(rt).released
    with rt.db.session() as session:
        rows = list(session.scalars(select(InferenceRequest).where(
            InferenceRequest.batch_id == batch_id).order_by(InferenceRequest.batch_line)))
    with rt.db.session() as session:
        for row in rows:
            session.execute(update(InferenceRequest).where(InferenceRequest.id == row.id)
                            .values(predicted_output_tokens=200,
                                    predicted_output_tokens_p90=None))
    before = estimate_batch(rt, batch_id)
    finished = [r.id for r in rows[:24]]
    with rt.db.session() as session:
        session.execute(update(InferenceRequest).where(InferenceRequest.id.in_(finished))
                        .values(status=RequestStatus.SUCCEEDED, output_tokens=100))
        session.execute(update(InferenceRequest).where(InferenceRequest.id == rows[24].id)
                        .values(status=RequestStatus.FAILED))
        # After the first running line (rows[25]): long answers, which must not count.
        session.execute(update(InferenceRequest)
                        .where(InferenceRequest.id.in_([r.id for r in rows[26:30]]))
                        .values(status=RequestStatus.SUCCEEDED, output_tokens=2000))
    with rt.db.session() as session:
        assert _calibration(session, batch_id) == pytest.approx(0.5)
    after = estimate_batch(rt, batch_id)
    assert after is not None and before is not None
    assert after.remaining_lines == before.remaining_lines - 29
    # The lines run side by side: 40 lines of 200 tokens take about as long as 11 of 200
    # would; 11 of 100, half as long.
    assert before.lines_per_s and after.lines_per_s
    left_before = before.remaining_lines / before.lines_per_s
    left_after = after.remaining_lines / after.lines_per_s
    assert left_after < 0.7 * left_before


def test_only_the_batchs_own_models_interactive_traffic_slows_it(rt: Runtime) -> None:
    """Each model runs on its own instances: another model's interactive stream takes none of
    this batch's fleet (two models at 2 req/s each were counted as 4 on each fleet)."""
    batch_id = _validated_batch(rt, [f"Describe {topic} in a long essay." for topic in TOPICS]
                                * 8)

    def busy(model: str) -> None:  # 1 long request a second over the last 300 s
        with rt.db.session() as session:
            for i in range(300):
                new_request(session, model=model, prompt_tokens=1000, max_tokens=1000,
                            prompt=f"{model} {i}")

    quiet = estimate_batch(rt, batch_id)
    busy("other")
    beside_other = estimate_batch(rt, batch_id)
    busy(rt.settings.model_name)
    beside_own = estimate_batch(rt, batch_id)
    assert quiet is not None and beside_other is not None and beside_own is not None
    assert beside_other.lines_per_s == quiet.lines_per_s
    assert beside_own.lines_per_s < 0.97 * quiet.lines_per_s  # 5.75 against 6.12
    with rt.db.session() as session:
        own = interactive_load(session, utcnow(), rt.settings.model_name)
        every = interactive_load(session, utcnow())
    assert every.rate_rps == pytest.approx(2 * own.rate_rps)


@pytest.fixture
def configs(monkeypatch: pytest.MonkeyPatch) -> list[eta.EtaConfig]:
    """The simulation settings of every estimate made."""
    seen: list[eta.EtaConfig] = []
    simulate = eta.estimate

    def recorded(*args: Any, **kwargs: Any) -> eta.Estimate:
        seen.append(args[3])
        return simulate(*args, **kwargs)

    monkeypatch.setattr(eta, "estimate", recorded)
    return seen


def test_a_batch_gets_its_models_share_of_the_window_beside_another_models_batch(
        rt: Runtime, configs: list[eta.EtaConfig]) -> None:
    """The releaser shares its window between the models' pools by their seats: two models
    of equal seats run half the window each, and a batch alone has all of it."""
    mine = _validated_batch(rt, [f"Describe {topic}." for topic in TOPICS])
    theirs = _validated_batch(rt, ["Name a colour."] * 3)
    with rt.db.session() as session:
        model = session.get(Batch, mine).model
        session.get(Batch, theirs).model = "other"
    estimate_batch(rt, mine)
    assert configs[-1].max_in_flight == 32  # no live instance: equal weights
    rt.fleet.publish("gpu.0", engine_state(model=model, max_num_seqs=48))
    rt.fleet.publish("gpu.1", engine_state(model="other", max_num_seqs=16))
    estimate_batch(rt, mine)
    estimate_batch(rt, theirs)
    assert [c.max_in_flight for c in configs[-2:]] == [48, 16]  # 64 by seats, 48 to 16
    with rt.db.session() as session:
        session.get(Batch, theirs).status = BatchStatus.COMPLETED
    estimate_batch(rt, mine)
    assert configs[-1].max_in_flight == 64  # alone again: the whole window


def test_the_estimate_uses_the_adaptive_window_without_stepping_it(
        rt: Runtime, configs: list[eta.EtaConfig]) -> None:
    rt = Runtime(rt.settings.model_copy(update={"batch_headroom_ttft_s": 1.0}))
    batch_id = _validated_batch(rt, [f"Describe {topic}." for topic in TOPICS])
    estimate_batch(rt, batch_id)
    assert configs[-1].max_in_flight == 64  # no round stored a window yet: the cap
    stored = json.dumps({"window": 12.0, "num_waiting": 0})
    rt.redis.set(BATCH_WINDOW_KEY, stored)
    estimate_batch(rt, batch_id)
    estimate_batch(rt, batch_id)
    assert [c.max_in_flight for c in configs[-2:]] == [12, 12]
    assert rt.redis.get(BATCH_WINDOW_KEY).decode() == stored


@pytest.mark.parametrize(("engine_kind", "expected_s"), [("emulated", 8.0), ("vllm", 2.0)])
def test_the_releasers_rounds_are_simulated_in_the_fleets_seconds(
        rt: Runtime, configs: list[eta.EtaConfig], engine_kind: str,
        expected_s: float) -> None:
    """An emulated fleet runs `emulated_time_scale` wall seconds per emulated one: a round
    every 2 wall seconds at 0.25 is one every 8 emulated seconds."""
    rt = Runtime(rt.settings.model_copy(update={
        "batch_release_interval_s": 2.0, "emulated_time_scale": 0.25,
        "engine_kind": engine_kind}))
    batch_id = _validated_batch(rt, [f"Describe {topic}." for topic in TOPICS])
    assert estimate_batch(rt, batch_id) is not None
    assert configs[-1].release_interval_s == pytest.approx(expected_s)


def test_the_pipelines_delay_to_the_engines_is_measured_on_recent_batch_lines(
        rt: Runtime, configs: list[eta.EtaConfig]) -> None:
    """A released line holds its slot in the window from its release, but its seat only once
    its engine admits it: the median release-to-admission delay of the batch lines admitted
    lately, in the fleet's seconds (interactive requests and old lines not counted)."""
    rt = Runtime(rt.settings.model_copy(update={"emulated_time_scale": 0.5,
                                                "engine_kind": "emulated"}))
    batch_id = _validated_batch(rt, [f"Describe {topic}." for topic in TOPICS])
    estimate_batch(rt, batch_id)
    assert configs[-1].dispatch_delay_s == 0.0  # nothing admitted yet
    now = utcnow()

    def admitted(delay_s: float, ago_s: float, priority: str) -> None:
        with rt.db.session() as session:
            request_id = new_request(session, priority=priority, prompt=f"{delay_s} {ago_s}")
            row = session.get(InferenceRequest, request_id)
            row.started_at = now - timedelta(seconds=ago_s)
            row.created_at = row.started_at - timedelta(seconds=delay_s)

    for delay_s in (0.2, 0.4, 0.6):
        admitted(delay_s, 5.0, "batch")
    admitted(30.0, 5.0, "interactive")  # held completions: not the batch's path
    admitted(30.0, 1_000.0, "batch")  # long ago
    with rt.db.session() as session:
        assert dispatch_delay(session, now) == pytest.approx(0.4)
    estimate_batch(rt, batch_id, now=now)
    assert configs[-1].dispatch_delay_s == pytest.approx(0.8)  # 0.4 wall s at time scale 0.5
