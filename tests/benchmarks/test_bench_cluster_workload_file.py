"""bench_cluster --fleet --workload-file: anyone can check a plan (issue 41)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from workers.cluster_sim import poisson_unit_arrivals

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "bench_cluster.py"
FLEET = ('[{"model": "chat", "count": 2, "gpu_kind": "A30"},'
         ' {"model": "chat", "gpu_kind": "L40S"}, {"model": "code", "gpu_kind": "A100-80GB"}]')


def _workload(path: Path) -> Path:
    rows = [{"arrival_s": t / 3.0, "model": "chat", "prompt_tokens": 150 + i % 200,
             "output_tokens": 80 + (i * 7) % 150} for i, t in enumerate(
                 poisson_unit_arrivals(120, 0))]
    rows += [{"arrival_s": t / 1.0, "model": "code", "prompt_tokens": 1500 + i % 500,
              "output_tokens": 20} for i, t in enumerate(poisson_unit_arrivals(40, 1))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)


def test_the_last_line_gives_each_models_latencies(tmp_path: Path) -> None:
    workload = _workload(tmp_path / "w.jsonl")
    args = ("--fleet", FLEET, "--workload-file", str(workload), "--model-map",
            "chat=llama-2-7b", "code=llama-3-8b")
    done = _run(*args)
    assert done.returncode == 0, done.stderr
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(last["models"]) == {"chat", "code"}
    chat, code = last["models"]["chat"], last["models"]["code"]
    assert chat["policy"] == "block_slo" and code["policy"] == "round_robin"  # the defaults
    # Lengthened as blockq plan judges: 3,000 requests a model by default (--min-requests).
    assert chat["requests"] >= 3000 and code["requests"] >= 3000
    for figures in (chat, code):
        assert 0 < figures["ttft_p99_s"] <= figures["e2e_p99_s"]
    shorter = json.loads(_run(*args, "--min-requests", "0").stdout.strip().splitlines()[-1])
    assert 300 <= shorter["models"]["chat"]["requests"] < 3000  # 100 an instance at least
    # Four times the rate on the same fleet: later first tokens.
    faster = json.loads(_run(*args, "--rate-scale", "4").stdout.strip().splitlines()[-1])
    assert faster["models"]["chat"]["ttft_p99_s"] > chat["ttft_p99_s"]


def test_a_model_the_fleet_does_not_serve_is_named(tmp_path: Path) -> None:
    workload = _workload(tmp_path / "w.jsonl")
    done = _run("--fleet", '[{"model": "chat", "gpu_kind": "A30"}]', "--workload-file",
                str(workload), "--model-map", "chat=llama-2-7b")
    assert done.returncode != 0
    assert "model 'code' of the workload has no instance in the fleet" in done.stderr
