"""The emulated engine's output-length sources and their registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers.serve.engine import GenerationRequest
from workers.serve.output_lengths import (
    OUTPUT_LENGTHS,
    AnswerLengths,
    MaxTokensLengths,
    ShareGptLengths,
    sharegpt_output_tokens,
)


def _request(request_id: str, prompt: str = "x", max_tokens: int = 16) -> GenerationRequest:
    return GenerationRequest(request_id, prompt, max_tokens=max_tokens)


def test_sharegpt_quantiles_interpolate() -> None:
    assert sharegpt_output_tokens(0.0) == 3
    assert sharegpt_output_tokens(50.0) == 286
    assert sharegpt_output_tokens(100.0) == 1734
    assert 286 < sharegpt_output_tokens(52.5) < 314
    draws = [ShareGptLengths()(_request(f"m{i}")) for i in range(2000)]
    median = sorted(draws)[1000]
    assert 240 < median < 330


def test_sources_are_registered_by_their_settings_names(tmp_path: Path) -> None:
    answers = tmp_path / "answers.jsonl"
    answers.write_text(json.dumps({"prompt": "known", "output_tokens": 37}) + "\n")
    assert OUTPUT_LENGTHS.names() == ["answers", "max_tokens", "sharegpt"]
    assert OUTPUT_LENGTHS.get("sharegpt").configure(None) == ShareGptLengths()
    assert OUTPUT_LENGTHS.get("max_tokens").configure(None)(_request("a", max_tokens=9)) == 9
    replay = OUTPUT_LENGTHS.get("answers").configure(answers)
    assert isinstance(replay, AnswerLengths) and replay(_request("b", prompt="known")) == 37
    assert isinstance(OUTPUT_LENGTHS.get("max_tokens").configure(answers), MaxTokensLengths)


def test_answers_need_a_file_and_unknown_sources_are_refused() -> None:
    with pytest.raises(ValueError, match="needs emulated_answers_path"):
        OUTPUT_LENGTHS.get("answers").configure(None)
    with pytest.raises(ValueError, match="known: answers, max_tokens, sharegpt"):
        OUTPUT_LENGTHS.get("uniform")


def test_each_instance_replays_its_own_models_answers(tmp_path: Path) -> None:
    """Two models answer one prompt at unlike lengths: rows naming a model go to that model's
    instances only, over rows that name none."""
    answers = tmp_path / "answers.jsonl"
    answers.write_text("\n".join(json.dumps(row) for row in [
        {"prompt": "shared", "output_tokens": 10},
        {"prompt": "shared", "output_tokens": 400, "model": "verbose"},
        {"prompt": "only-terse", "output_tokens": 7, "model": "terse"},
    ]) + "\n")
    verbose = OUTPUT_LENGTHS.get("answers").configure(answers, model="verbose")
    terse = OUTPUT_LENGTHS.get("answers").configure(answers, model="terse")
    assert verbose(_request("a", prompt="shared")) == 400
    assert terse(_request("a", prompt="shared")) == 10
    assert terse(_request("b", prompt="only-terse")) == 7
    assert verbose(_request("b", prompt="only-terse")) == ShareGptLengths()(
        _request("b", prompt="only-terse"))
