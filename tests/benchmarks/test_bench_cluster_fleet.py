"""bench_cluster --fleet: a fleet of unlike instances in the BLOCKQ_FLEET format, end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "bench_cluster.py"
DATA = REPO_ROOT.parent / "shared" / "data"
FLEET = ('[{"model": "llama-2-7b", "exec_model": "llama-2-7b-a100"},'
         ' {"model": "llama-2-7b", "count": 2, "exec_model": "llama-2-7b-a30"}]')


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not DATA.is_dir(), reason="shared ShareGPT lengths not present")
def test_a_small_fleet_run_writes_capacities_per_config_and_slo(tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    done = _run("--fleet", FLEET, "--configs", "least_requests", "capacity_weighted",
                "--num-requests", "300", "--rates", "4:10:3", "--bisect", "0", "--slo", "3",
                "--jobs", "1", "--no-plots", "--no-cdf", "--json", str(out))
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    model = data["models"][0]
    assert model["model"] == "1xllama-2-7b-a100+2xllama-2-7b-a30"
    assert set(model["capacity"]) == {"least_requests", "capacity_weighted"}
    for slos in model["capacity"].values():
        passing, _ = slos["3"]
        assert passing is not None and passing > 0
    # Weighted by measured capacity it carries at least as much as counting requests does.
    assert model["capacity"]["capacity_weighted"]["3"][0] >= model["capacity"][
        "least_requests"]["3"][0]
    # The ceiling: one A100 and two A30s, each saturated with the workload.
    assert 8.0 < model["ceiling_rps"] < 16.0
    assert {row["num_instances"] for row in data["summary"]} == {3}


@pytest.mark.parametrize(("fleet", "problem"), [
    ('[{"model": "llama-2-7b", "count": 0}]', "fleet entry 0: count"),
    ('[{"model": "llama-2-7b", "exec_model": "llama-2-7b-v100"}]', "unknown execution-time"),
    ('{"model": "llama-2-7b"}', "non-empty JSON list"),
    ('[{"model": "mystery"}]', "names no exec_model"),
    ("no-such-file.json", "neither a JSON list nor a file"),
])
def test_a_bad_fleet_is_refused_with_the_problem_named(fleet: str, problem: str) -> None:
    done = _run("--fleet", fleet, "--no-plots")
    assert done.returncode == 2
    assert problem in done.stderr and "Traceback" not in done.stderr
