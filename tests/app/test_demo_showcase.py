"""The demo's routing showcase: its shipped data, the stream it replays, its fleet's settings and
its table (app/cli/showcase.py); the run itself needs the whole stack (`make demo`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.cli.showcase import (
    FLEET,
    PassResult,
    ShowcasePrompt,
    build_stream,
    length_scores,
    length_table,
    load_showcase_prompts,
    model_path,
    showcase_settings,
    showcase_table,
)
from app.settings import Settings
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

    assert settings.engine_kind == "emulated" and settings.num_instances == FLEET.instances
    assert settings.emulated_output_lengths == "answers"
    assert settings.data_dir == tmp_path / "showcase"
    assert settings.length_model_path == model_path()
    assert settings.routing_policy == "block"


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
    results = [PassResult(policy, 3, 3, [0.1, 0.2, 5.0], [1.0, 2.0, 9.0], [10, 20, 30],
                          [10, 20, 40]) for policy in ("round_robin", "block")]
    table = showcase_table(results)
    assert [c.header for c in table.columns] == ["metric", "round_robin", "block"]
    cells = {row: [c._cells[i] for c in table.columns[1:]]
             for i, row in enumerate(table.columns[0]._cells)}
    assert cells["requests succeeded"] == ["3 / 3", "3 / 3"]
    assert cells["TTFT p99 (s)"] == [f"{np.percentile([0.1, 0.2, 5.0], 99):.2f}"] * 2


def test_length_table_compares_the_model_with_the_baseline() -> None:
    result = PassResult("block", 3, 3, [], [], [20, 50, 1000], [10, 100, 1000])
    table = length_table(result)
    rows = table.columns[0]._cells
    assert rows == ["learned model (MiniLM + features)", "mean-length baseline"]
    assert table.columns[3]._cells == ["1.00", "-"]
