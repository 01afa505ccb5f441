"""`blockq models length-train|length-predict|length-info` on files, no service: the round trip,
zero-shot for a model never trained on, one-line errors for bad input, licences in the artifact,
MiniLM as the encoder the commands train on by default, each encoder on request, and the shipped
head each CPU picks."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from app.cli.models import models
from workers.predict import length_model
from workers.predict.encoder import DEFAULT_ENCODER
from workers.predict.length_model import (
    BOOTSTRAP_ARTIFACT,
    STATIC_BOOTSTRAP_ARTIFACT,
    LengthHead,
    bootstrap_artifact,
    default_encoder_kind,
)
from workers.predict.static_encoder import STATIC_ENCODER, StaticEncoder

#: Serving models of the fixture: how verbose each is, and one that always says the same.
VERBOSITY = {"terse": 0.5, "plain": 1.0, "wordy": 2.0}
TASKS = (("Describe {t} in {n} words.", 1.3), ("Briefly, what is {t}? One word.", 0.0),
         ("Write a detailed essay about {t}.", 600.0), ("List {n} facts about {t}.", 15.0))
TOPICS = ("tea", "rivers", "the moon", "compilers", "bees", "jazz", "glaciers", "chess",
          "bridges", "volcanoes", "owls", "salt")


def _prompt(i: int, rng: random.Random) -> tuple[str | list, float]:
    template, per = TASKS[i % len(TASKS)]
    n = rng.choice((5, 10, 50, 100, 200))
    text = template.format(t=TOPICS[i % len(TOPICS)], n=n) + f" ({i})"
    base = 3.0 if per == 0.0 else (per if "essay" in template else per * n)
    prompt: str | list = [{"role": "user", "content": text}] if i % 5 == 0 else text
    return prompt, base


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    rng = random.Random(0)
    folder = tmp_path_factory.mktemp("length_cli")
    train, test, truth = [], [], []
    for i in range(60):
        prompt, base = _prompt(i, rng)
        for model, factor in VERBOSITY.items():
            tokens = max(1, round(base * factor * rng.uniform(0.85, 1.15)))
            if i < 45:
                train.append({"prompt": prompt, "model": model, "output_tokens": tokens})
            else:
                test.append({"prompt": prompt, "model": model})
                truth.append(tokens)
        if i < 45:
            train.append({"prompt": prompt, "model": "fixed-text", "output_tokens": 227})
        else:
            test.append({"prompt": prompt, "model": "never-trained-on"})
            truth.append(None)
    artifact = folder / "length.npz"
    result = CliRunner().invoke(models, ["length-train", "--data", str(_write(
        folder / "train.jsonl", train)), "--out", str(artifact), "--licence", "CC0-1.0",
        "--source-name", "fixture"])
    assert result.exit_code == 0, result.output
    (folder / "truth.json").write_text(json.dumps(truth))
    return {"artifact": artifact, "test": _write(folder / "test.jsonl", test),
            "truth": folder / "truth.json", "folder": folder}


def _predict(files: dict[str, Path], data: Path) -> list[int]:
    result = CliRunner().invoke(models, ["length-predict", "--artifact", str(files["artifact"]),
                                         "--data", str(data)])
    assert result.exit_code == 0, result.output
    return [json.loads(line)["predicted_tokens"] for line in result.stdout.splitlines()]


def test_round_trip_predicts_each_test_line_in_order(files) -> None:
    predicted = _predict(files, files["test"])
    tests = [json.loads(line) for line in files["test"].read_text().splitlines()]
    truth = json.loads(files["truth"].read_text())
    assert len(predicted) == len(tests)
    pairs = [(p, t) for p, t in zip(predicted, truth, strict=True) if t is not None]
    errors = np.array([abs(p - t) / t for p, t in pairs])
    assert np.median(errors) < 0.35  # unseen prompts: lengths follow the request
    by_model = {m: [p for p, row in zip(predicted, tests, strict=True) if row["model"] == m]
                for m in VERBOSITY}
    assert np.median(by_model["terse"]) < np.median(by_model["plain"]) < np.median(
        by_model["wordy"])
    # Order: predicting the lines reversed gives the same numbers reversed.
    reversed_file = _write(files["folder"] / "reversed.jsonl", tests[::-1])
    assert _predict(files, reversed_file) == predicted[::-1]


def test_unknown_model_is_predicted_zero_shot_between_the_known_ones(files) -> None:
    head = LengthHead.load(files["artifact"])
    assert "never-trained-on" not in head.model_names
    # The model that always writes the same text is kept out of the prompt effect.
    assert "fixed-text" in head.metrics["prompt_insensitive_models"]
    prompt = "Write a detailed essay about lighthouses."
    rows = [{"prompt": prompt, "model": m} for m in ("terse", "never-trained-on", "wordy",
                                                     "fixed-text")]
    terse, unknown, wordy, fixed = _predict(files, _write(files["folder"] / "zero.jsonl", rows))
    assert terse < unknown < wordy
    assert abs(fixed - 227) <= 5


@pytest.mark.parametrize(("content", "message"), [
    (None, "cannot read"),
    ('{"prompt": "a", "model": "m"}\n{"prompt": "b", "model"\n', ":2: not valid JSON"),
    ('{"prompt": "a"}\n', ":1: missing field 'model'"),
    ('{"prompt": "", "model": "m"}\n', ":1: prompt is empty"),
    ('[1, 2]\n', ":1: a line must be a JSON object"),
])
def test_bad_test_input_is_one_line_and_exit_code_2(files, tmp_path: Path, content: str | None,
                                                    message: str) -> None:
    path = tmp_path / "test.jsonl"
    if content is not None:
        path.write_text(content)
    result = CliRunner().invoke(models, ["length-predict", "--artifact", str(files["artifact"]),
                                         "--data", str(path)])
    assert result.exit_code == 2
    assert message in result.output and str(path) in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


@pytest.mark.parametrize(("line", "message"), [
    ('{"prompt": "a", "model": "m"}', ":1: missing field 'output_tokens'"),
    ('{"prompt": "a", "model": "m", "output_tokens": "5"}', ":1: output_tokens must be"),
    ('{"prompt": "a", "model": "m", "output_tokens": true}', ":1: output_tokens must be"),
    ('{"prompt": [{"role": "user"}], "model": "m", "output_tokens": 5}', ":1: each chat message"),
])
def test_bad_train_input_names_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text(line + "\n")
    result = CliRunner().invoke(models, ["length-train", "--data", str(path), "--out",
                                         str(tmp_path / "a.npz")])
    assert result.exit_code == 2 and message in result.output
    assert "Traceback" not in result.output and not (tmp_path / "a.npz").exists()


def test_missing_artifact_is_a_clear_error(files, tmp_path: Path) -> None:
    result = CliRunner().invoke(models, ["length-predict", "--artifact",
                                         str(tmp_path / "nope.npz"), "--data", str(files["test"])])
    assert result.exit_code == 2 and "no such artifact" in result.output


def test_the_artifact_records_its_sources_and_licences(files) -> None:
    head = LengthHead.load(files["artifact"])
    assert [dict(s) for s in head.sources] == [
        {"name": "fixture", "licence": "CC0-1.0", "rows": 180}]
    result = CliRunner().invoke(models, ["length-info", "--artifact", str(files["artifact"])])
    assert result.exit_code == 0 and "CC0-1.0" in result.output and "fixture" in result.output
    # The accurate encoder by default, whatever this CPU: the serving CPU may be another.
    assert head.encoder["name"] == DEFAULT_ENCODER


@pytest.mark.parametrize(("kind", "name"), [("minilm", DEFAULT_ENCODER),
                                            ("static", STATIC_ENCODER)])
def test_each_encoder_on_request(files, tmp_path: Path, kind: str, name: str) -> None:
    artifact = tmp_path / f"{kind}.npz"
    result = CliRunner().invoke(models, ["length-train", "--data", str(files["folder"]
                                         / "train.jsonl"), "--out", str(artifact),
                                         "--encoder", kind])
    assert result.exit_code == 0, result.output
    head = LengthHead.load(artifact)
    assert head.encoder["name"] == name and (head.encoder.get("kind") == "static") == (
        kind == "static")
    predicted = _predict({"artifact": artifact}, files["test"])
    assert len(predicted) == len(files["test"].read_text().splitlines())


@pytest.mark.parametrize(("amx", "kind", "artifact"), [
    (True, "minilm", BOOTSTRAP_ARTIFACT), (False, "static", STATIC_BOOTSTRAP_ARTIFACT)])
def test_the_cpu_picks_the_shipped_head(monkeypatch: pytest.MonkeyPatch, amx: bool,
                                        kind: str, artifact: Path) -> None:
    """MiniLM only where the CPU has AMX (elsewhere it is over the 5 ms budget); the static
    head everywhere else. Both heads ship and carry the same sources."""
    monkeypatch.setattr(length_model, "cpu_has_amx_bf16", lambda: amx)
    assert default_encoder_kind() == kind and bootstrap_artifact() == artifact
    assert bootstrap_artifact("static") == STATIC_BOOTSTRAP_ARTIFACT
    assert LengthHead.load(artifact).sources == LengthHead.load(BOOTSTRAP_ARTIFACT).sources
    with pytest.raises(ValueError, match="encoder must be one of"):
        bootstrap_artifact("bert")


def test_the_shipped_artifact_carries_the_alpaca_eval_licence() -> None:
    head = LengthHead.load(BOOTSTRAP_ARTIFACT)
    assert any(s["licence"] == "CC BY-NC 4.0" and "AlpacaEval" in s["name"]
               for s in head.sources)
    assert len(head.model_names) > 200 and head.prior_rows is not None
    result = CliRunner().invoke(models, ["length-info", "--artifact", str(BOOTSTRAP_ARTIFACT)])
    assert result.exit_code == 0 and "CC BY-NC 4.0" in result.output


def test_static_encoder_embeds_without_torch_and_keeps_order() -> None:
    encoder = StaticEncoder.load()
    texts = ["Write an essay about tea.", "", "short", "Write an essay about tea."]
    out = encoder.embed(texts)
    assert out.shape == (4, encoder.dim) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out[[0, 2]], axis=1), 1.0, rtol=1e-5)
    assert not out[1].any()  # no token: zeros
    np.testing.assert_allclose(out[0], out[3])
    np.testing.assert_allclose(encoder.embed(["short"])[0], out[2])
