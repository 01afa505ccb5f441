"""The demo's routing showcase: its shipped data, the stream it replays, its fleet's settings and
its table (app/cli/showcase.py); the run itself needs the whole stack (`make demo`)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from rich.progress import Progress

from app.cli.showcase import (
    FLEET,
    PassResult,
    ShowcasePrompt,
    build_stream,
    length_scores,
    length_table,
    load_showcase_prompts,
    model_path,
    showcase_policies,
    showcase_settings,
    showcase_table,
)
from app.cli.showcase_batch import BatchRun, BatchWatcher, batch_input, batch_table
from domain.settings import Settings
from workers.predict.length_model import LengthHead


def test_shipped_prompts_carry_real_answer_lengths() -> None:
    prompts = load_showcase_prompts()
    assert len(prompts) == len({p.prompt for p in prompts}) >= FLEET.requests
    lengths = [p.output_tokens for p in prompts]
    assert min(lengths) >= 1 and len(set(lengths)) > 100  # real, varied lengths


def test_shipped_length_model_loads() -> None:
    assert LengthHead.load(model_path()).encoder["name"]


def test_stream_is_seeded_unique_first_and_at_the_rate() -> None:
    prompts = [ShowcasePrompt(f"p{i}", 10 + i, "m") for i in range(50)]
    stream = build_stream(prompts, num_requests=2000, rate=8.0, seed=3)

    assert stream == build_stream(prompts, num_requests=2000, rate=8.0, seed=3)
    assert stream != build_stream(prompts, num_requests=2000, rate=8.0, seed=4)
    assert len({r.prompt.prompt for r in stream[:50]}) == 50  # each once before any repeats
    times = [r.arrival_s for r in stream]
    assert times[0] == 0.0 and times == sorted(times)
    assert len(stream) / times[-1] == pytest.approx(8.0, rel=0.1)


def test_fleet_settings_are_emulated_on_their_own_data_dir(tmp_path: Path) -> None:
    base = Settings(data_dir=tmp_path, routing_policy="round_robin")
    settings = showcase_settings(base, tmp_path / "answers.jsonl")

    assert settings.engine_kind == "emulated" and len(settings.instances) == FLEET.instances
    assert settings.emulated_output_lengths == "answers"
    assert settings.data_dir == tmp_path / "showcase"
    assert settings.resolved_model_path == base.resolved_model_path  # the demo's tokenizer
    assert settings.length_model_path == model_path()
    assert settings.routing_policy == settings.mixed_fleet_routing_policy == "block_slo"


def test_fleet_is_mixed_hardware_declared_as_blockq_fleet(tmp_path: Path) -> None:
    """Fast instances first, then slow ones, each an emulated engine of the demo's model with
    its own execution-time model; the children read the fleet back from BLOCKQ_FLEET, and the
    demo's own two-model fleet does not leak into the showcase."""
    base = Settings(data_dir=tmp_path, fleet='[{"model": "tiny-llama"}, {"model": "tiny-qwen"}]')
    settings = showcase_settings(base, tmp_path / "answers.jsonl")

    assert [spec.exec_model for spec in settings.instances] == [
        "llama-2-7b-h100", "llama-2-7b-h100", "llama-2-7b-a30", "llama-2-7b-a30"]
    assert {spec.model for spec in settings.instances} == {base.model_name}
    assert {spec.engine for spec in settings.instances} == {"emulated"}
    assert {spec.model_path for spec in settings.instances} == {base.resolved_model_path}
    assert settings.for_instance("gpu.0").emulated_exec_model == "llama-2-7b-h100"
    assert settings.for_instance("gpu.3").emulated_exec_model == "llama-2-7b-a30"
    again = Settings(data_dir=tmp_path, fleet=settings.as_env()["BLOCKQ_FLEET"])
    assert [s.exec_model for s in again.instances] == [s.exec_model for s in settings.instances]
    assert FLEET.groups() == [("2 x H100", ["gpu.0", "gpu.1"]), ("2 x A30", ["gpu.2", "gpu.3"])]
    assert FLEET.describe() == "2 x H100 + 2 x A30 (llama-2-7b)"


def test_predictive_policy_runs_last_after_the_baselines(tmp_path: Path) -> None:
    assert showcase_policies(Settings(data_dir=tmp_path)) == (
        "round_robin", "least_requests", "block_slo")
    assert showcase_policies(Settings(data_dir=tmp_path, mixed_fleet_routing_policy="block")) == (
        "round_robin", "least_requests", "block")


def test_length_scores_against_the_mean_baseline() -> None:
    learned, baseline = length_scores([10, 100, 1000], [10, 100, 1000])
    assert learned.mae_tokens == 0.0 and learned.median_rel_error == 0.0
    assert learned.spearman == pytest.approx(1.0)
    assert baseline.mae_tokens == pytest.approx((360 + 270 + 630) / 3)  # mean 370
    assert baseline.spearman is None  # a constant ranks nothing
    learned, _ = length_scores([20, 50, 1000], [10, 100, 1000])
    assert learned.median_rel_error == pytest.approx(0.5)
    assert learned.spearman == pytest.approx(1.0)
    learned, _ = length_scores([1000, 50, 20], [10, 100, 1000])
    assert learned.spearman == pytest.approx(-1.0)


def test_table_puts_the_policies_side_by_side() -> None:
    placements = {"round_robin": ("gpu.0", "gpu.1", "gpu.2"),
                  "least_requests": ("gpu.3", "gpu.2", "gpu.0"),
                  "block_slo": ("gpu.0", "gpu.1", "gpu.0")}
    results = [PassResult(policy, 3, 3, [0.1, 0.2, 5.0], [1.0, 2.0, 9.0], [10, 20, 30],
                          [10, 20, 40], ids) for policy, ids in placements.items()]
    table = showcase_table(results)
    assert [c.header for c in table.columns] == ["metric", *placements]
    assert "2 x H100 + 2 x A30" in str(table.title) and "mixed fleet" in str(table.title)
    cells = {row: [c._cells[i] for c in table.columns[1:]]
             for i, row in enumerate(table.columns[0]._cells)}
    assert cells["requests succeeded"] == ["3 / 3"] * 3
    assert cells["TTFT p99 (s)"] == [f"{np.percentile([0.1, 0.2, 5.0], 99):.2f}"] * 3
    assert cells["requests run on the 2 x H100"] == ["2", "1", "3"]
    assert cells["requests run on the 2 x A30"] == ["1", "2", "0"]


def test_length_table_compares_the_model_with_the_baseline() -> None:
    result = PassResult("block", 3, 3, [], [], [20, 50, 1000], [10, 100, 1000])
    table = length_table(result)
    rows = table.columns[0]._cells
    assert rows == ["learned model (MiniLM + features)", "mean-length baseline"]
    assert table.columns[3]._cells == ["1.00", "-"]


def test_batch_input_is_one_completions_line_per_prompt_asking_for_the_room() -> None:
    data = batch_input(["first prompt", "second"], model="m", rooms=[100, 7])
    lines = [json.loads(line) for line in data.decode().splitlines()]
    assert [line["custom_id"] for line in lines] == ["line-0", "line-1"]
    assert {line["url"] for line in lines} == {"/v1/completions"}
    assert [line["body"]["max_tokens"] for line in lines] == [100, 7]
    assert lines[1]["body"] == {"model": "m", "prompt": "second", "max_tokens": 7,
                                "temperature": 0}


def test_batch_table_sets_the_stream_alone_beside_the_stream_with_the_batch() -> None:
    run = BatchRun(lines=48, completed=47, failed=1, status="completed",
                   done_during_stream=12, stream_ended_s=40.2, finished_s=71.0)
    table = batch_table(("0.10", "0.80"), ("0.12", "0.95"), run, policy="block_slo")
    assert "(block_slo)" in str(table.title)
    cells = dict(zip(table.columns[0]._cells, table.columns[1]._cells, strict=True))
    assert cells["stream TTFT p50 / p99 (s), alone"] == "0.10 / 0.80"
    assert cells["stream TTFT p50 / p99 (s), beside the batch"] == "0.12 / 0.95"
    assert cells["batch lines done while the stream ran"] == "12 of 48 (by 40 s)"
    assert cells["batch completed: lines completed / failed"] == "47 / 1 (all done at 71 s)"


def test_fleet_settings_let_the_batch_yield_to_the_stream(tmp_path: Path) -> None:
    settings = showcase_settings(Settings(data_dir=tmp_path), tmp_path / "answers.jsonl")
    assert settings.batch_headroom_ttft_s == FLEET.batch_ttft_target_s > 0
    assert settings.max_batch_in_flight == FLEET.instances * FLEET.max_num_seqs
    assert settings.batch_headroom_slot_margin >= 0  # within the slots the stream leaves
    assert 0 < settings.engine_interactive_seats == FLEET.interactive_seats < FLEET.max_num_seqs
    assert settings.engine_batch_prefill_last


def test_batch_watcher_follows_the_batch_and_notes_the_stream_end() -> None:
    states = iter([("in_progress", 0, 0), ("in_progress", 3, 0), ("in_progress", 5, 1),
                   ("completed", 7, 1)])

    def answer(request: httpx.Request) -> httpx.Response:
        status, completed, failed = next(states, ("completed", 7, 1))
        return httpx.Response(200, json={"status": status, "request_counts": {
            "total": 8, "completed": completed, "failed": failed}})

    client = httpx.Client(transport=httpx.MockTransport(answer), base_url="http://showcase")
    with Progress(disable=True) as progress:
        watcher = BatchWatcher(client, "batch_1", progress, lines=8, time_scale=1.0)
        watcher.start()
        run = watcher.result(timeout_s=10)
    assert (run.status, run.completed, run.failed, run.lines) == ("completed", 7, 1, 8)
    assert run.finished_s is not None and run.finished_s >= 0
