"""The table length predictor: fixed predictions per prompt (Settings.length_predictor 'table')."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from domain.settings import Settings
from workers.predict.stage import LENGTH_PREDICTOR_STAGES, LengthQuery, TableLengths
from workers.predict.table import MISSING_NAME, TABLE_NAME, PredictionTable, prompt_key


def _write(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + "\n")
    return path


def test_known_prompts_get_their_predictions_capped_by_max_tokens(tmp_path: Path) -> None:
    table = PredictionTable.from_jsonl(_write(tmp_path / "t.jsonl", [
        {"prompt": "short", "predicted_tokens": 12},
        {"prompt": "long", "predicted_tokens": 900},
        {"prompt": "short", "predicted_tokens": 20},  # the last line of a prompt wins
    ]))
    assert table.lookup("short", max_tokens=256) == (20, TABLE_NAME)
    assert table.lookup("long", max_tokens=256) == (256, TABLE_NAME)


def test_a_missing_prompt_gets_the_mean_and_says_so(tmp_path: Path) -> None:
    table = PredictionTable.from_jsonl(_write(tmp_path / "t.jsonl", [
        {"prompt": "a", "predicted_tokens": 10}, {"prompt": "b", "predicted_tokens": 31}]))
    assert table.lookup("never seen", max_tokens=1000) == (20, MISSING_NAME)  # round(20.5)
    assert table.lookup("never seen", max_tokens=5) == (5, MISSING_NAME)


def test_chat_messages_are_keyed_by_their_canonical_json(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "hi"}]
    table = PredictionTable.from_jsonl(_write(tmp_path / "t.jsonl", [
        {"prompt": messages, "predicted_tokens": 7}]))
    assert table.lookup([{"content": "hi", "role": "user"}], max_tokens=100) == (7, TABLE_NAME)
    assert prompt_key("text") == "text"


@pytest.mark.parametrize("row", [
    {"prompt": "x"},
    {"predicted_tokens": 3},
    {"prompt": "x", "predicted_tokens": 0},
    {"prompt": "x", "predicted_tokens": 2.5},
    {"prompt": "x", "predicted_tokens": True},
    {"prompt": "", "predicted_tokens": 3},
    ["not", "an", "object"],
])
def test_a_bad_row_is_refused_naming_its_line(tmp_path: Path, row: object) -> None:
    path = _write(tmp_path / "t.jsonl", [{"prompt": "ok", "predicted_tokens": 1}, row])
    with pytest.raises(ValueError, match=r"t\.jsonl:2"):
        PredictionTable.from_jsonl(path)


def test_an_empty_table_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one prompt"):
        PredictionTable.from_jsonl(_write(tmp_path / "t.jsonl", []))


def test_the_stage_answers_from_the_configured_table(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [{"prompt": "p", "predicted_tokens": 42}])
    settings = Settings(length_predictor="table", length_predictions_path=path)
    stage = LENGTH_PREDICTOR_STAGES.create("table", SimpleNamespace(settings=settings))
    answer = stage.predict(LengthQuery("p", max_tokens=100))
    assert (answer.tokens, answer.p90_tokens, answer.predictor) == (42, None, TABLE_NAME)
    assert stage.predict(LengthQuery("q", max_tokens=100)).predictor == MISSING_NAME


def test_the_stage_needs_a_path() -> None:
    with pytest.raises(ValueError, match="length_predictions_path"):
        TableLengths(SimpleNamespace(settings=Settings(length_predictor="table")))  # type: ignore[arg-type]


def test_the_path_travels_to_child_processes(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [{"prompt": "p", "predicted_tokens": 1}])
    env = Settings(length_predictor="table", length_predictions_path=path).as_env()
    assert env["BLOCKQ_LENGTH_PREDICTOR"] == "table"
    assert env["BLOCKQ_LENGTH_PREDICTIONS_PATH"] == str(path.resolve())
