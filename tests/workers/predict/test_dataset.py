"""Bootstrap rows: every source read, answers counted in tokens, split by prompt only."""

from __future__ import annotations

import json
from pathlib import Path

from tests.workers.synthetic_lengths import synthetic_rows
from workers.predict.dataset import (
    ARENA_BENCH,
    ARENA_HARD,
    SHAREGPT_MODEL,
    SHAREGPT_PAIRS,
    SHAREGPT_PROMPTS,
    LengthRow,
    build_rows,
    load_prompts_only,
    prompt_id_of,
    read_rows,
    split_by_prompt,
    write_rows,
)


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def make_data_dir(root: Path) -> Path:
    """The layout of ../shared/data/conversations, two prompts per source."""
    hard = root / ARENA_HARD
    write_jsonl(hard / "question.jsonl", [
        {"uid": "h1", "category": "x", "cluster": "c", "prompt": "Say hi."},
        {"uid": "h2", "category": "x", "cluster": "c", "prompt": "Shared prompt."},
    ])
    for model, answers in (("gpt-a", ("hi", "one two three")), ("gpt-b", ("hello there", ""))):
        write_jsonl(hard / "model_answer" / f"{model}.jsonl", [
            {"uid": uid, "ans_id": "a", "model": model,
             "messages": [{"role": "user", "content": "q"},
                          {"role": "assistant", "content": {"answer": text}}]}
            for uid, text in zip(("h1", "h2"), answers, strict=True)])
    bench = root / ARENA_BENCH
    write_jsonl(bench / "question.jsonl", [
        {"question_id": "b1", "category": "y", "turns": ["Shared  prompt."]},
        {"question_id": "b2", "category": "y", "turns": ["Count to three."]},
    ])
    write_jsonl(bench / "model_answer" / "vicuna.jsonl", [
        {"question_id": "b1", "answer_id": "x", "model_id": "vicuna",
         "choices": [{"index": 0, "turns": ["sure", "a follow-up answer"]}]},
        {"question_id": "b2", "answer_id": "y", "model_id": "vicuna",
         "choices": [{"index": 0, "turns": ["one, two, three"]}]},
    ])
    pairs = root / SHAREGPT_PAIRS
    pairs.parent.mkdir(parents=True, exist_ok=True)
    pairs.write_text(json.dumps([{"conversation_id": "s1", "conversations": [
        {"from": "human", "value": "Tell a joke."}, {"from": "gpt", "value": "Why did..."}]}]))
    (root / SHAREGPT_PROMPTS).write_text(json.dumps([
        {"id": "p1", "conversations": [{"from": "human", "value": "Only a prompt."}]}]))
    return root


def test_build_rows_reads_every_source(tmp_path: Path, counter) -> None:
    rows = build_rows(make_data_dir(tmp_path), counter)
    by_key = {(r.source, r.model, r.prompt): r for r in rows}
    assert len(rows) == 6  # the empty gpt-b answer is skipped
    assert by_key[("arena-hard-v0.1", "gpt-a", "Shared prompt.")].output_tokens == counter(
        "one two three")
    # The first answer turn only: later turns answer follow-ups the question file lacks.
    assert by_key[("arena-bench-v1", "vicuna", "Shared  prompt.")].output_tokens == counter(
        "sure")
    assert by_key[("sharegpt_sample", SHAREGPT_MODEL, "Tell a joke.")].output_tokens >= 1
    # The same prompt text in two sources is one prompt (one group for the split).
    shared = {r.prompt_id for r in rows if " ".join(r.prompt.split()) == "Shared prompt."}
    assert shared == {prompt_id_of("Shared prompt.")}
    assert load_prompts_only(tmp_path) == ["Only a prompt."]


def test_split_is_by_prompt_and_deterministic() -> None:
    rows = synthetic_rows(num_prompts=60)
    train, test = split_by_prompt(rows, test_share=0.25, seed=3)
    assert len(train) + len(test) == len(rows) and train and test
    assert not {r.prompt_id for r in train} & {r.prompt_id for r in test}
    assert split_by_prompt(rows, test_share=0.25, seed=3) == (train, test)
    assert split_by_prompt(rows, test_share=0.25, seed=4) != (train, test)


def test_jsonl_round_trip_and_history_shaped_rows(tmp_path: Path) -> None:
    rows = synthetic_rows(num_prompts=4)
    assert write_rows(tmp_path / "rows.jsonl", rows) == len(rows)
    assert read_rows(tmp_path / "rows.jsonl") == rows
    # A history export may carry only prompt, model and output_tokens.
    write_jsonl(tmp_path / "history.jsonl",
                [{"prompt": "Hi", "model": "m", "output_tokens": 7, "extra": 1}])
    assert read_rows(tmp_path / "history.jsonl") == [
        LengthRow(prompt_id_of("Hi"), "Hi", "m", 7, "")]
