"""Replay workloads: requests.jsonl round trip, validation, the shared request sequence."""

from __future__ import annotations

import json

import pytest

from workers.cluster_sim.workload import (
    ReplayPrompt,
    load_replay_prompts,
    replay_sequence,
    replay_workload,
)


def _prompt(i: int, *, prompt_tokens: int = 10, output_tokens: int = 20) -> ReplayPrompt:
    return ReplayPrompt(f"prompt {i}", "gpt-4-0314", output_tokens, prompt_tokens, 15 + i)


def test_replay_prompts_round_trip_through_jsonl(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rows = [_prompt(i) for i in range(3)] + [ReplayPrompt("é ünïcode\nline", "m", 1, 1, 1)]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r.to_dict(), ensure_ascii=False) + "\n\n" for r in rows),
                    encoding="utf-8")
    assert load_replay_prompts(path) == rows


@pytest.mark.parametrize(("line", "message"), [
    ('{"prompt": "p", "source_model": "m", "output_tokens": 3, "prompt_tokens": 1}',
     "lacks predicted_tokens"),
    ('{"prompt": " ", "source_model": "m", "output_tokens": 3, "prompt_tokens": 1, '
     '"predicted_tokens": 2}', "non-empty prompt"),
    ('{"prompt": "p", "source_model": "m", "output_tokens": 0, "prompt_tokens": 1, '
     '"predicted_tokens": 2}', "output_tokens must be a positive integer"),
    ('{"prompt": "p", "source_model": "m", "output_tokens": 3, "prompt_tokens": 1.5, '
     '"predicted_tokens": 2}', "prompt_tokens must be a positive integer"),
    ('[1, 2]', "not a JSON object"),
    ('{"prompt": ', "Expecting value"),
])
def test_malformed_rows_are_refused_with_their_line(tmp_path, line, message) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "requests.jsonl"
    good = json.dumps(_prompt(0).to_dict())
    path.write_text(f"{good}\n{line}\n")
    with pytest.raises(ValueError, match=message) as error:
        load_replay_prompts(path)
    assert ":2:" in str(error.value)


def test_an_empty_file_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n")
    with pytest.raises(ValueError, match="no replay prompts"):
        load_replay_prompts(path)


def test_replay_sequence_uses_every_prompt_before_repeating_and_is_seeded() -> None:
    prompts = [_prompt(i) for i in range(7)]
    sequence = replay_sequence(prompts, 10, seed=3)
    assert len(sequence) == 10 and set(sequence[:7]) == set(prompts)
    assert sequence == replay_sequence(prompts, 10, seed=3)
    assert sequence != replay_sequence(prompts, 10, seed=4)


def test_replay_workload_fits_lengths_to_the_model_and_keeps_predictions() -> None:
    prompts = [_prompt(0, prompt_tokens=100, output_tokens=50),
               _prompt(1, prompt_tokens=4000, output_tokens=500),
               _prompt(2, prompt_tokens=4096)]  # vLLM rejects it: dropped
    workload = replay_workload(prompts, num_requests=3, max_model_len=4096, seed=0)
    assert sorted(zip(workload.num_prompt_tokens, workload.num_output_tokens,
                      workload.predicted_output_tokens, strict=True)) == [(100, 50, 15),
                                                                          (4000, 96, 16)]
    assert workload.head(1).predicted_output_tokens == workload.predicted_output_tokens[:1]
