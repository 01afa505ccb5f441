"""The autoscaling interface: bounds per fleet entry, GPU kinds checked against the catalog at
start, instance ids that stay put, the settings surviving the trip to child processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import main
from domain.settings import Settings

FLEET = json.dumps([
    {"model": "chat", "count": 1, "min_count": 0, "max_count": 2, "engine": "emulated",
     "exec_model": "llama-2-7b-a30", "gpu_kind": "a30", "start_s": 30},
    {"model": "chat", "count": 0, "max_count": 1, "engine": "emulated",
     "exec_model": "llama-2-7b-h100", "gpu_kind": "h100-80gb"},
])


def _catalog(tmp_path: Path) -> Path:
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"kinds": [{"name": "a30", "price_per_hour": 0.9},
                                          {"name": "h100-80gb", "price_per_hour": 4.5}]}))
    return path


def test_slots_keep_their_ids_and_only_the_starting_count_runs(tmp_path: Path) -> None:
    settings = Settings(fleet=FLEET, autoscale=True, autoscale_catalog=_catalog(tmp_path))
    assert settings.instance_ids == ["gpu.0", "gpu.1", "gpu.2"]
    assert settings.initial_instance_ids == ["gpu.0"]
    assert settings.gpu_prices == {"a30": 0.9, "h100-80gb": 4.5}
    assert settings.for_instance("gpu.1").emulated_start_s == 30
    assert settings.for_instance("gpu.2").emulated_exec_model == "llama-2-7b-h100"
    # A child process reads the same fleet back from the environment.
    child = Settings(fleet=settings.as_env()["BLOCKQ_FLEET"])
    assert child.instance_ids == settings.instance_ids
    assert child.initial_instance_ids == settings.initial_instance_ids


@pytest.mark.parametrize(("fleet", "names"), [
    ('[{"model": "m"}, {"model": "m", "count": 2, "min_count": 3, "max_count": 4}]',
     "fleet entry 1: count (2) must lie within min_count (3)"),
    ('[{"model": "m", "count": 1, "min_count": 2, "max_count": 1}]',
     "fleet entry 0: min_count (2) is above max_count (1)"),
    ('[{"model": "m", "count": -2}]', "fleet entry 0: count: Input should be greater"),
    ('[{"model": "m"}, {"model": "m", "gpu_kind": "tpu-v9"}]',
     "fleet entry 1: gpu_kind 'tpu-v9' is not in the GPU catalog"),
])
def test_the_cli_refuses_a_fleet_that_cannot_hold_naming_the_entry(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fleet: str, names: str) -> None:
    monkeypatch.setenv("BLOCKQ_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("BLOCKQ_FLEET", fleet)
    monkeypatch.setenv("BLOCKQ_AUTOSCALE", "true")
    monkeypatch.setenv("BLOCKQ_AUTOSCALE_CATALOG", str(_catalog(tmp_path)))
    result = CliRunner().invoke(main, ["migrate"])
    assert result.exit_code == 1
    assert names in result.output
    assert "Traceback" not in result.output


def test_a_catalog_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="GPU catalog .*missing.json"):
        Settings(fleet='[{"model": "m", "gpu_kind": "a30"}]',
                 autoscale_catalog=tmp_path / "missing.json")
