"""How the shipped artifacts are made (`benchmarks.artifacts`) and the length evaluation's folds
(`benchmarks.length_eval`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.artifacts import sample_prompts
from benchmarks.length_eval import folds_of
from workers.predict.dataset import LengthRow


def test_the_demos_output_budget_follows_the_answer_within_its_bounds() -> None:
    assert sample_prompts.max_tokens_for("") == sample_prompts.MIN_MAX_TOKENS
    assert sample_prompts.max_tokens_for("word " * 400) == 100
    assert sample_prompts.max_tokens_for("word " * 10_000) == sample_prompts.MAX_MAX_TOKENS


def test_the_shipped_sample_prompts_are_made_again_byte_for_byte(tmp_path: Path) -> None:
    if not (sample_prompts.DEFAULT_DATA_DIR / "conversations").is_dir():
        pytest.skip(f"the shared data is not at {sample_prompts.DEFAULT_DATA_DIR}")
    out = tmp_path / "sample_prompts.jsonl"
    samples = sample_prompts.build_samples(sample_prompts.DEFAULT_DATA_DIR,
                                           sample_prompts.DEFAULT_COUNT,
                                           sample_prompts.DEFAULT_SEED)
    sample_prompts.write_jsonl(samples, out)
    assert out.read_bytes() == sample_prompts.DEFAULT_OUT.read_bytes()
    assert all(json.loads(line)["max_tokens"] >= 16 for line in out.read_text().splitlines())


def _rows() -> list[LengthRow]:
    return [LengthRow(f"p{p}", f"prompt {p}", model, 10 + p)
            for p in range(20) for model in ("a", "b", "c")]


def test_cross_validation_folds_keep_every_answer_to_a_prompt_together() -> None:
    rows = _rows()
    folds = folds_of(rows, "cv", 5)
    assert len(folds) == 5
    tested = np.concatenate([test for _, test in folds])
    assert sorted(tested) == list(range(len(rows)))  # each answer tested once
    for train, test in folds:
        assert not {rows[i].prompt_id for i in train} & {rows[i].prompt_id for i in test}


def test_leave_one_model_out_holds_out_the_model_and_its_folds_prompts() -> None:
    rows = _rows()
    folds = folds_of(rows, "lomo", 4)
    assert len(folds) == 3 * 4
    for train, test in folds:
        (model,) = {rows[i].model for i in test}
        assert model not in {rows[i].model for i in train}
        assert not {rows[i].prompt_id for i in train} & {rows[i].prompt_id for i in test}
