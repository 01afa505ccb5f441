"""The length head by path: the hot path gets the fast (static) head, bulk work the accurate
(MiniLM) one whatever the CPU; `length-train` writes both from the same rows and `length-info`
says which path uses which."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli.models import models
from domain.models import Priority
from domain.settings import Settings
from workers.predict import length_model
from workers.predict.encoder import DEFAULT_ENCODER
from workers.predict.length_model import (
    BOOTSTRAP_ARTIFACT,
    STATIC_BOOTSTRAP_ARTIFACT,
    LengthHead,
    head_artifact,
    static_sibling,
)
from workers.predict.stage import (
    HEAD_ACCURATE,
    HEAD_FAST,
    LearnedLengths,
    LengthQuery,
    head_for,
    learned_lengths,
    length_predictor,
)
from workers.predict.static_encoder import STATIC_ENCODER
from workers.runtime import Runtime


@pytest.mark.parametrize("amx", [True, False])
def test_each_path_gets_its_head_whatever_the_cpu(monkeypatch: pytest.MonkeyPatch,
                                                   amx: bool) -> None:
    monkeypatch.setattr(length_model, "cpu_has_amx_bf16", lambda: amx)
    assert head_artifact("fast") == STATIC_BOOTSTRAP_ARTIFACT
    assert head_artifact("accurate") == BOOTSTRAP_ARTIFACT
    with pytest.raises(ValueError, match="head path must be one of"):
        head_artifact("hot")


def test_the_fast_head_is_found_beside_a_configured_accurate_one(tmp_path: Path) -> None:
    accurate = tmp_path / "mine.npz"
    assert head_artifact("fast", accurate=accurate) == STATIC_BOOTSTRAP_ARTIFACT  # none beside
    static_sibling(accurate).write_bytes(b"")
    assert static_sibling(accurate) == tmp_path / "mine_static.npz"
    assert head_artifact("fast", accurate=accurate) == tmp_path / "mine_static.npz"
    assert head_artifact("fast", accurate=accurate, fast=tmp_path / "x.npz") == tmp_path / "x.npz"
    assert head_artifact("accurate", accurate=accurate) == accurate


def test_interactive_queries_take_the_fast_path_and_batch_lines_the_accurate_one() -> None:
    assert head_for(LengthQuery("hi", 8, Priority.INTERACTIVE.rank)) == HEAD_FAST
    assert head_for(LengthQuery("hi", 8, Priority.BATCH.rank)) == HEAD_ACCURATE


def test_each_path_loads_its_own_head(fresh_services: Settings) -> None:
    rt = Runtime(fresh_services.model_copy(update={"length_predictor": "learned"}))
    fast, accurate = learned_lengths(rt, HEAD_FAST), learned_lengths(rt, HEAD_ACCURATE)
    assert fast is length_predictor(rt, HEAD_FAST) and accurate is length_predictor(rt)
    assert fast is not accurate and accurate is learned_lengths(rt)  # the learning loop's
    assert fast.packaged.encoder.name == STATIC_ENCODER
    assert accurate.packaged.encoder.name == DEFAULT_ENCODER
    answers = accurate.predict_many([LengthQuery("Write an essay about tea.", 512, 1),
                                     LengthQuery("Yes or no: is tea green?", 512, 1)])
    assert [a.predictor for a in answers] == [accurate.packaged.name] * 2
    assert answers[0].tokens > answers[1].tokens


def test_the_fast_path_keeps_its_head_when_a_version_is_on_another_encoder(
        fresh_services: Settings) -> None:
    """A registry version retrained on MiniLM would load torch into the API."""
    rt = Runtime(fresh_services.model_copy(update={"length_predictor": "learned"}))
    fast = LearnedLengths(rt, HEAD_FAST)
    minilm_version = BOOTSTRAP_ARTIFACT.read_bytes()
    assert fast._with_version(minilm_version) is fast.packaged  # noqa: SLF001
    static_version = STATIC_BOOTSTRAP_ARTIFACT.read_bytes()
    assert fast._with_version(static_version).encoder is fast.packaged.encoder  # noqa: SLF001


def test_length_train_writes_both_heads_from_the_same_rows(tmp_path: Path) -> None:
    rows = [{"prompt": f"{ask} number {i}", "model": model, "output_tokens": tokens * (1 + i % 3)}
            for i in range(24) for ask, tokens in (("Write an essay on tea", 400),
                                                   ("Yes or no: tea", 3))
            for model in ("a", "b")]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "heads.npz"
    result = CliRunner().invoke(models, ["length-train", "--data", str(data), "--out", str(out)])
    assert result.exit_code == 0, result.output
    accurate, fast = LengthHead.load(out), LengthHead.load(static_sibling(out))
    assert accurate.encoder["name"] == DEFAULT_ENCODER
    assert fast.encoder["name"] == STATIC_ENCODER
    assert accurate.sources == fast.sources and accurate.model_names == fast.model_names
    assert head_artifact("fast", accurate=out) == static_sibling(out)  # served as a pair


def test_length_info_says_which_path_uses_which_head(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BLOCKQ_LENGTH_MODEL_PATH", raising=False)
    monkeypatch.delenv("BLOCKQ_LENGTH_FAST_MODEL_PATH", raising=False)
    result = CliRunner().invoke(models, ["length-info"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    fast = next(line for line in lines if line.startswith("fast head"))
    accurate = next(line for line in lines if line.startswith("accurate head"))
    assert STATIC_BOOTSTRAP_ARTIFACT.name in fast and STATIC_ENCODER in fast
    assert BOOTSTRAP_ARTIFACT.name in accurate and DEFAULT_ENCODER in accurate
    assert " ms" in fast and " ms" in accurate  # each path's measured cost
    assert "CC BY-NC 4.0" in result.output  # then the accurate head's sources
