"""The extra sampling parameters, token-id prompts and logprobs reach each engine and act there:
vLLM (the tiny random-weight model, in process) and the emulated engine (what it honours)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.workers.serve.recording import RecordingListener
from workers.serve.emulated_engine import EmulatedEngine, EmulatedEngineConfig
from workers.serve.engine import GenerationRequest, GenerationResult, SamplingOptions

RESULT_TIMEOUT_S = 120
#: The tiny model's tokenizer: "Hello there" is these ids (BOS first).
HELLO_THERE_IDS = (1, 46, 1614, 85, 645)


def _run(engine, *requests: GenerationRequest) -> list[GenerationResult]:  # type: ignore[no-untyped-def]
    """One after the other: alone in its batch, a request's logits do not depend on the others
    (the tiny random model's near-ties would otherwise let greedy answers differ)."""
    return [engine.submit(r).result(RESULT_TIMEOUT_S) for r in requests]


def _output_ids(result: GenerationResult) -> list[int]:
    assert result.logprobs is not None
    return [entry["id"] for entry in result.logprobs["output"]]


@pytest.mark.vllm
def test_vllm_takes_token_ids_and_every_sampling_parameter(vllm_engine) -> None:  # type: ignore[no-untyped-def]
    greedy = SamplingOptions(logprobs=0)
    hot = 1.5  # a high temperature: without top_k or min_p, any token may be drawn
    text, ids, top_k, top_k_again, min_p, min_p_again, free, free_again, penalised = _run(
        vllm_engine,
        GenerationRequest("s-text", "Hello there", 12, temperature=0.0, sampling=greedy),
        GenerationRequest("s-ids", "ignored: the ids win", 12, temperature=0.0,
                          prompt_token_ids=HELLO_THERE_IDS, sampling=greedy),
        # NOTE: 4 tokens: the tiny random model's 5th token after this prompt is an exact tie
        # of two tokens, which top_k=1 and min_p=1 both keep.
        *[GenerationRequest(f"s-{name}-{run}", "Hello there", 4, temperature=hot,
                            sampling=sampling)
          for name, sampling in (("topk", SamplingOptions(top_k=1)),
                                 ("minp", SamplingOptions(min_p=1.0)),
                                 ("free", SamplingOptions()))
          for run in (1, 2)],
        GenerationRequest("s-pen", "Hello there", 12, temperature=0.0, sampling=SamplingOptions(
            repetition_penalty=1.3, frequency_penalty=1.0, presence_penalty=1.0, logprobs=0)),
    )
    assert ids.num_prompt_tokens == len(HELLO_THERE_IDS) == text.num_prompt_tokens
    assert ids.output_text == text.output_text  # the same tokens in: the same greedy answer
    # top_k=1 and min_p=1 leave only the most likely token: the same answer at a temperature
    # where two free draws differ.
    assert top_k.output_text == top_k_again.output_text
    assert min_p.output_text == min_p_again.output_text
    assert free.output_text != free_again.output_text
    greedy_ids = _output_ids(text)
    assert len(greedy_ids) == 12 and text.finish_reason == "length"
    # The penalties change the greedy answer of a model that repeats itself.
    if len(set(greedy_ids)) < len(greedy_ids):
        assert _output_ids(penalised) != greedy_ids

    third = greedy_ids[2]
    first_at = greedy_ids.index(third)
    stopped, held, biased = _run(
        vllm_engine,
        GenerationRequest("s-stop", "Hello there", 12, temperature=0.0,
                          sampling=SamplingOptions(stop_token_ids=(third,))),
        GenerationRequest("s-min", "Hello there", 12, temperature=0.0, sampling=SamplingOptions(
            stop_token_ids=(greedy_ids[0],), min_tokens=6, ignore_eos=True, logprobs=0)),
        GenerationRequest("s-bias", "Hello there", 6, temperature=0.0,
                          sampling=SamplingOptions(logit_bias=((42, 100.0),), logprobs=0)),
    )
    assert stopped.finish_reason == "stop" and stopped.num_output_tokens == first_at + 1
    # min_tokens: the stop token cannot end it before 6 tokens (greedy would stop at once).
    assert held.num_output_tokens >= 6 and greedy_ids[0] not in _output_ids(held)[:6]
    assert _output_ids(biased) == [42] * 6  # logit_bias +100 on one token: only that token


@pytest.mark.vllm
def test_vllm_returns_output_and_prompt_logprobs(vllm_engine) -> None:  # type: ignore[no-untyped-def]
    (scored,) = _run(vllm_engine, GenerationRequest(
        "s-echo", "", 3, temperature=0.0, prompt_token_ids=HELLO_THERE_IDS,
        sampling=SamplingOptions(logprobs=2, echo=True)))
    assert scored.logprobs is not None
    prompt, output = scored.logprobs["prompt"], scored.logprobs["output"]
    assert [e["id"] for e in prompt] == list(HELLO_THERE_IDS)
    assert prompt[0]["logprob"] is None and prompt[0]["top"] == []  # nothing precedes BOS
    assert len(output) == scored.num_output_tokens == 3
    assert "".join(e["token"] for e in output) == scored.output_text
    for entry in prompt[1:] + output:
        assert -9999.0 <= entry["logprob"] <= 0.0
        ranks = sorted(t["rank"] for t in entry["top"])
        assert ranks[:2] == [1, 2] and len(entry["top"]) <= 3  # the 2 best, and the token
        assert entry["id"] in {t["id"] for t in entry["top"]}
    # Greedy: each chosen token is the most likely one.
    assert all(any(t["id"] == e["id"] and t["rank"] == 1 for t in e["top"]) for e in output)


@pytest.fixture
def emulated(recorder: RecordingListener) -> Iterator[EmulatedEngine]:
    # Every request's drawn answer is 3 tokens: what ends it then shows in its length.
    engine = EmulatedEngine(EmulatedEngineConfig(time_scale=0.01, noise=0.0,
                                                 output_lengths=lambda request: 3), recorder)
    engine.start()
    yield engine
    engine.stop()


def test_emulated_engine_honours_what_shapes_the_length_and_makes_up_logprobs(
    emulated: EmulatedEngine,
) -> None:
    drawn, to_the_end, at_least, scored = _run(
        emulated,
        GenerationRequest("e-drawn", "x" * 40, 10),
        GenerationRequest("e-eos", "x" * 40, 10, sampling=SamplingOptions(ignore_eos=True)),
        GenerationRequest("e-min", "x" * 40, 10, sampling=SamplingOptions(min_tokens=6)),
        GenerationRequest("e-lp", "", 4, prompt_token_ids=(1, 2, 3, 4, 5, 6, 7),
                          sampling=SamplingOptions(logprobs=2, echo=True)),
    )
    assert (drawn.num_output_tokens, drawn.finish_reason) == (3, "stop")
    assert (to_the_end.num_output_tokens, to_the_end.finish_reason) == (10, "length")
    assert (at_least.num_output_tokens, at_least.finish_reason) == (6, "stop")
    assert drawn.logprobs is None
    assert scored.num_prompt_tokens == 7  # the ids, not the (empty) text
    assert scored.logprobs is not None
    output, prompt = scored.logprobs["output"], scored.logprobs["prompt"]
    assert "".join(e["token"] for e in output) == scored.output_text
    assert len(prompt) == 7 and prompt[0]["logprob"] is None
    assert all(len(e["top"]) == 2 and e["logprob"] <= 0 for e in output + prompt[1:])
