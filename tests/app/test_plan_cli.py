"""`blockq plan`: inputs from a file or the request history, the JSON and fleet it writes, and a
clear error (naming the line, model or kind) with nothing written for every bad input."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from app.cli.plan import history_workload, parse_slo, plan
from domain.db import Database
from domain.models import RequestOutcome
from domain.settings import Settings
from workers.cluster_sim import poisson_unit_arrivals
from workers.plan import load_catalog
from workers.sim.fleet_declaration import parse_fleet

SLOS = ("--slo", "llama-2-7b:ttft_p99=1.5", "--slo", "llama-3-8b:ttft_p99=3,e2e_p99=8")


def _rows(model: str, num: int, rate: float, prompt: int, output: int, seed: int) -> list[dict]:
    return [{"arrival_s": t / rate, "model": model, "prompt_tokens": prompt + (i * 37) % prompt,
             "output_tokens": output + (i * 53) % output}
            for i, t in enumerate(poisson_unit_arrivals(num, seed))]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-model workload and a catalog of two profiled kinds (quick to simulate)."""
    folder = tmp_path_factory.mktemp("plan")
    rows = (_rows("llama-2-7b", 240, 3.0, 200, 120, 0)
            + _rows("llama-3-8b", 120, 1.5, 1200, 30, 1))
    _write_jsonl(folder / "workload.jsonl", sorted(rows, key=lambda r: r["arrival_s"]))
    catalog = json.loads(load_catalog().model_dump_json())
    catalog["kinds"] = [k for k in catalog["kinds"] if k["name"] in ("A30", "A100-80GB")]
    (folder / "catalog.json").write_text(json.dumps(catalog))
    return folder


def _plan(folder: Path, *args: str) -> Result:
    # NOTE: the workload as it is (not repeated to the default 3,000 requests a model): quick.
    return CliRunner().invoke(plan, ["--catalog", str(folder / "catalog.json"),
                                     "--min-requests", "0", *args])


@pytest.fixture(scope="module")
def planned(inputs: Path) -> tuple[Result, Path]:
    out = inputs / "out"
    out.mkdir()
    result = _plan(inputs, "--workload", str(inputs / "workload.jsonl"), *SLOS,
                   "--json", str(out / "plan.json"), "--fleet-out", str(out / "fleet.json"))
    return result, out


def test_the_plan_json_has_the_issue_shape(planned: tuple[Result, Path]) -> None:
    result, out = planned
    assert result.exit_code == 0, result.output
    report = json.loads((out / "plan.json").read_text())
    assert {"fleet", "cost_per_hour", "models", "headroom", "alternatives"} <= set(report)
    assert {e["model"] for e in report["fleet"]} == {"llama-2-7b", "llama-3-8b"}
    for entry in report["fleet"]:
        assert {"model", "count", "gpu_kind", "exec_model"} <= set(entry)
    assert report["cost_per_hour"] == pytest.approx(
        sum(e["count"] * e["price_per_hour"] for e in report["fleet"]), abs=1e-3)
    for figures in report["models"].values():
        assert figures["ttft_p99_s"] is not None and figures["meets_targets"]
    assert report["models"]["llama-3-8b"]["e2e_p99_s"] <= 8
    assert report["headroom"] >= 1.0
    names = [a["name"] for a in report["alternatives"]]
    assert names == ["single:A30", "single:A100-80GB", "routing_blind"]
    for alternative in report["alternatives"]:
        assert {"fleet", "cost_per_hour", "meets_targets", "models"} <= set(alternative)
        if alternative["meets_targets"]:
            assert report["cost_per_hour"] <= alternative["cost_per_hour"] + 1e-9
    assert "Planned fleet" in result.output and "Alternatives" in result.output


def test_the_fleet_out_is_a_fleet_blockq_serve_accepts(planned: tuple[Result, Path]) -> None:
    result, out = planned
    assert result.exit_code == 0, result.output
    text = (out / "fleet.json").read_text()
    report = json.loads((out / "plan.json").read_text())
    specs = parse_fleet(text)
    assert len(specs) == sum(e["count"] for e in report["fleet"])
    settings = Settings(fleet=text)  # as BLOCKQ_FLEET
    assert [s.exec_model for s in settings.fleet] == [s.exec_model for s in specs]
    assert {s.gpu_kind for s in specs} == {e["gpu_kind"] for e in report["fleet"]}


def _bad(folder: Path, tmp_path: Path, *args: str) -> Result:
    """Runs a plan that must fail; checks it wrote nothing."""
    result = _plan(folder, *args, "--json", str(tmp_path / "plan.json"),
                   "--fleet-out", str(tmp_path / "fleet.json"))
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert not list(tmp_path.iterdir())
    return result


@pytest.mark.parametrize("bad_row,expected", [
    ({"arrival_s": 1.0, "prompt_tokens": 10, "output_tokens": 5}, "line 3: model: missing"),
    ({"arrival_s": 1.0, "model": "llama-2-7b", "prompt_tokens": -10, "output_tokens": 5},
     "line 3: prompt_tokens"),
    ({"arrival_s": 1.0, "model": "llama-2-7b", "prompt_tokens": 10, "output_tokens": -1},
     "line 3: output_tokens"),
])
def test_a_bad_workload_line_is_named(inputs: Path, tmp_path: Path, bad_row: dict,
                                      expected: str) -> None:
    rows = _rows("llama-2-7b", 4, 1.0, 100, 50, 0)
    rows.insert(2, bad_row)
    workload = _write_jsonl(tmp_path / "bad.jsonl", rows)
    out = tmp_path / "out"
    out.mkdir()
    result = _bad(inputs, out, "--workload", str(workload), *SLOS)
    assert expected in result.output


def test_a_model_without_a_target_is_named(inputs: Path, tmp_path: Path) -> None:
    result = _bad(inputs, tmp_path, "--workload", str(inputs / "workload.jsonl"),
                  "--slo", "llama-2-7b:ttft_p99=1.5")
    assert "model 'llama-3-8b' has no target" in result.output


def test_a_target_no_fleet_meets_says_the_best_figure(inputs: Path, tmp_path: Path) -> None:
    result = _bad(inputs, tmp_path, "--workload", str(inputs / "workload.jsonl"),
                  "--slo", "llama-2-7b:ttft_p99=1.5", "--slo", "llama-3-8b:ttft_p99=0.01")
    assert "model 'llama-3-8b': no fleet of the catalog meets ttft_p99<=0.01s" in result.output
    assert "p99 is ttft" in result.output


@pytest.mark.parametrize("slo,expected", [
    ("llama-2-7b", "expected MODEL:ttft_p99=S"),
    ("llama-2-7b:ttft=1", "'ttft=1': expected ttft_p99=S"),
    ("llama-2-7b:ttft_p99=fast", "is not a number of seconds"),
    ("llama-2-7b:ttft_p99=2,e2e_p99=1", "e2e_p99 cannot be below ttft_p99"),
])
def test_a_malformed_target_is_named(inputs: Path, tmp_path: Path, slo: str,
                                     expected: str) -> None:
    result = _bad(inputs, tmp_path, "--workload", str(inputs / "workload.jsonl"), "--slo", slo)
    assert expected in result.output


def test_a_catalog_kind_without_a_price_is_named(inputs: Path, tmp_path: Path) -> None:
    catalog = json.loads((inputs / "catalog.json").read_text())
    del catalog["kinds"][1]["price_per_hour"]
    bad = tmp_path / "catalog.json"
    bad.write_text(json.dumps(catalog))
    out = tmp_path / "out"
    out.mkdir()
    result = CliRunner().invoke(plan, ["--catalog", str(bad), "--workload",
                                       str(inputs / "workload.jsonl"), *SLOS,
                                       "--json", str(out / "plan.json")])
    assert result.exit_code != 0
    assert "GPU kind 'A100-80GB': price_per_hour: missing" in result.output
    assert not list(out.iterdir())


def test_workload_and_history_are_one_or_the_other(inputs: Path, tmp_path: Path) -> None:
    assert "give one of --workload FILE or --from-history HOURS" in _bad(
        inputs, tmp_path, *SLOS).output


def test_targets_parse_as_seconds() -> None:
    model, targets = parse_slo("tiny-llama:ttft_p99=0.5,e2e_p99=20")
    assert (model, targets.ttft_p99_s, targets.e2e_p99_s) == ("tiny-llama", 0.5, 20.0)


# -- from the history, on the real PostgreSQL ------------------------------------------------

@pytest.fixture
def history(fresh_services: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Database]:
    monkeypatch.setenv(Settings.env_name("database_url"), fresh_services.database_url)
    db = Database(fresh_services.resolved_database_url)
    yield db
    db.dispose()


def _add_outcomes(db: Database, model: str, rows: list[dict], end: datetime) -> None:
    with db.session() as session:
        for i, row in enumerate(rows):
            e2e = 2.0
            finished = end - timedelta(seconds=rows[-1]["arrival_s"] - row["arrival_s"])
            session.add(RequestOutcome(
                request_id=f"{model}-{i}-{end.timestamp()}", finished_at=finished + timedelta(
                    seconds=e2e), model_name=model, instance_id="gpu.0", prompt="p",
                features={}, prompt_tokens=row["prompt_tokens"], max_tokens=4096,
                output_tokens=row["output_tokens"], e2e_s=e2e))


def test_history_reads_the_window_only(history: Database) -> None:
    now = datetime.now(UTC)
    _add_outcomes(history, "tiny-llama", _rows("x", 50, 2.0, 100, 50, 0), now - timedelta(
        minutes=5))
    _add_outcomes(history, "tiny-llama", _rows("x", 30, 2.0, 100, 50, 1), now - timedelta(
        hours=5))
    workload = history_workload(history, 1.0, now)
    assert workload.models == ["tiny-llama"] and workload.num_requests == 50
    # The arrivals keep the history's spacing: 50 requests over their own span.
    assert workload.rate_by_model["tiny-llama"] == pytest.approx(2.0, rel=0.3)


def test_plan_from_history_with_a_model_map(history: Database, inputs: Path,
                                            tmp_path: Path) -> None:
    _add_outcomes(history, "tiny-llama", _rows("x", 200, 3.0, 200, 120, 0),
                  datetime.now(UTC) - timedelta(minutes=1))
    result = _plan(inputs, "--from-history", "1", "--model-map", "tiny-llama=llama-2-7b",
                   "--slo", "tiny-llama:ttft_p99=1.5", "--json", str(tmp_path / "plan.json"))
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "plan.json").read_text())
    assert set(report["models"]) == {"tiny-llama"}
    assert {e["exec_model"].removesuffix("-a30").removesuffix("-a100")
            for e in report["fleet"]} == {"llama-2-7b"}


def test_an_empty_history_window_is_an_error(history: Database, inputs: Path,
                                             tmp_path: Path) -> None:
    _add_outcomes(history, "tiny-llama", _rows("x", 20, 2.0, 100, 50, 0),
                  datetime.now(UTC) - timedelta(hours=3))
    result = _bad(inputs, tmp_path, "--from-history", "1", "--slo", "tiny-llama:ttft_p99=1")
    assert "the history holds no finished request in the last 1 hours" in result.output


def test_an_unmapped_served_name_is_named(history: Database, inputs: Path,
                                          tmp_path: Path) -> None:
    _add_outcomes(history, "tiny-llama", _rows("x", 20, 2.0, 100, 50, 0),
                  datetime.now(UTC) - timedelta(minutes=1))
    result = _bad(inputs, tmp_path, "--from-history", "1", "--slo", "tiny-llama:ttft_p99=1")
    assert "model 'tiny-llama' has no execution-time model" in result.output
    assert "--model-map SERVED=FAMILY" in result.output


