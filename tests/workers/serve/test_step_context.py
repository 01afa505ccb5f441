"""Step samples' context features from vLLM's scheduler (`ScheduleTap`), as the simulator's
`BatchStats` counts them: decodes attend their whole sequence, prefill chunks (a preempted
request's recomputation included) attend what was computed before them."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from workers.serve.engine import GenerationRequest
from workers.serve.vllm_engine import ScheduleTap, scheduled_batch_stats
from workers.sim.exec_model import BatchStats

RESULT_TIMEOUT_S = 60


@dataclass
class FakeRequest:
    """What the tap reads of vLLM's `Request`."""

    num_prompt_tokens: int
    num_output_tokens: int = 0
    num_computed_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens


@dataclass
class FakeOutput:
    num_scheduled_tokens: dict[str, int]


@dataclass
class FakeScheduler:
    """Schedules the chunks it is given and advances computed tokens, as vLLM's does."""

    requests: dict[str, FakeRequest] = field(default_factory=dict)
    plan: dict[str, int] = field(default_factory=dict)

    def schedule(self) -> FakeOutput:
        for request_id, num_new in self.plan.items():
            self.requests[request_id].num_computed_tokens += num_new
        return FakeOutput(dict(self.plan))


def step(scheduler: FakeScheduler, tap: ScheduleTap, plan: dict[str, int]) -> BatchStats:
    scheduler.plan = plan
    scheduler.schedule()
    scheduled = tap.take()
    assert scheduled is not None
    return scheduled.batch


def test_decodes_attend_their_whole_sequence_and_prefill_chunks_their_past() -> None:
    scheduler = FakeScheduler({
        "dec": FakeRequest(100, num_output_tokens=5, num_computed_tokens=104),
        "pre": FakeRequest(300, num_computed_tokens=200),  # second chunk of a chunked prompt
        "new": FakeRequest(50),
    })
    tap = ScheduleTap(scheduler)
    stats = step(scheduler, tap, {"dec": 1, "pre": 100, "new": 50})
    assert stats == BatchStats(num_prefill_tokens=150, num_decode_seqs=1, num_prefill_seqs=2,
                               decode_context_tokens=105,
                               prefill_chunk_x_context=100 * 200 + 50 * 0,
                               prefill_chunk_sq=100 * 100 + 50 * 50)
    assert tap.take() is None  # taken once


def test_the_tap_keeps_each_scheduled_requests_progress_under_its_submitted_id() -> None:
    # vLLM's ids carry "-" and 8 random hex characters; a prompt whose first 320 tokens the
    # prefix cache served starts there (vLLM set num_computed_tokens before scheduling it).
    scheduler = FakeScheduler({
        "req_1-0a1b2c3d": FakeRequest(1000, num_computed_tokens=320),
        "pc-2-deadbeef": FakeRequest(50),
        "plain": FakeRequest(10, 2, 11),  # randomization off: the id as submitted
    })
    tap = ScheduleTap(scheduler)
    scheduler.plan = {"req_1-0a1b2c3d": 512, "pc-2-deadbeef": 50, "plain": 1}
    scheduler.schedule()
    scheduled = tap.take()
    assert scheduled is not None
    assert scheduled.num_computed_tokens == {"req_1": 832, "pc-2": 50, "plain": 12}


def test_a_recompute_after_preemption_is_prefill_with_its_context() -> None:
    # 120 prompt + 40 output tokens, preempted: vLLM (no prefix caching) computes from 0 again.
    request = FakeRequest(120, num_output_tokens=40, num_computed_tokens=0)
    scheduler = FakeScheduler({"victim": request, "other": FakeRequest(10, 3, 12)})
    tap = ScheduleTap(scheduler)

    first = step(scheduler, tap, {"victim": 100, "other": 1})
    assert (first.num_prefill_tokens, first.num_prefill_seqs) == (100, 1)
    assert (first.prefill_chunk_x_context, first.prefill_chunk_sq) == (0, 100 * 100)
    assert (first.num_decode_seqs, first.decode_context_tokens) == (1, 13)

    second = step(scheduler, tap, {"victim": 59})  # the rest but the last token
    assert (second.num_prefill_tokens, second.num_decode_seqs) == (59, 0)
    assert (second.prefill_chunk_x_context, second.prefill_chunk_sq) == (59 * 100, 59 * 59)

    # Its next one-token chunk is at the end of its sequence: a decode again.
    assert step(scheduler, tap, {"victim": 1}) == BatchStats(
        num_decode_seqs=1, decode_context_tokens=160)


def test_an_async_scheduled_decode_counts_its_placeholder_token() -> None:
    # Async scheduling: the previous token is not sampled yet (a placeholder), so vLLM's
    # request holds 10 + 3 tokens while 14 are computed once this step's token is scheduled.
    request = FakeRequest(10, 3, 14)
    request.num_output_placeholders = 1  # type: ignore[attr-defined]
    assert scheduled_batch_stats({"a": 1}, {"a": request}) == BatchStats(
        num_decode_seqs=1, decode_context_tokens=14)


def test_the_same_chunks_give_the_simulators_stats() -> None:
    requests = {"a": FakeRequest(64, 2, 66), "b": FakeRequest(500, 0, 300)}
    assert scheduled_batch_stats({"a": 1, "b": 200}, requests) == BatchStats.of_chunks(
        [(1, 65, 66), (200, 100, 500)])


@pytest.mark.vllm
def test_the_real_engines_samples_carry_the_context_of_one_request(
    vllm_engine, engine_listener
) -> None:
    """One request alone: its prompt is prefill from 0, then every decode step attends the
    prompt and the output so far (prompt + k tokens at the k-th decode)."""
    first_step = len(engine_listener.steps)
    result = vllm_engine.submit(
        GenerationRequest("ctx-one", "Tell me about queues. " * 8, max_tokens=12,
                          predicted_output_tokens=12)
    ).result(RESULT_TIMEOUT_S)
    steps = engine_listener.steps[first_step:]
    prompt, output = result.num_prompt_tokens, result.num_output_tokens
    assert output == 12 or result.finish_reason == "stop"
    assert sum(s.num_prefill_tokens for s in steps) == prompt
    assert sum(s.prefill_chunk_sq for s in steps) == prompt * prompt  # one chunk (< 512)
    assert sum(s.prefill_chunk_x_context for s in steps) == 0
    decodes = output - 1  # the first output token comes with the prefill
    assert sum(s.num_decode_tokens for s in steps) == decodes
    assert sum(s.decode_context_tokens for s in steps) == sum(
        prompt + k for k in range(1, decodes + 1))
