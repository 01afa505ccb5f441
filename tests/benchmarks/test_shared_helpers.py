"""The benchmarks' shared helpers: percentiles, table cells and tables, paths, the local services
and stack."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest

from benchmarks import local, paths, stats, tables
from domain.settings import Settings


@pytest.mark.parametrize("n", [1, 2, 7, 100])
def test_percentile_and_quantile_match_numpy(n: int) -> None:
    values = list(np.random.default_rng(n).exponential(1.0, n))
    for q in (0, 50, 99, 100):
        assert stats.percentile(values, q) == pytest.approx(np.percentile(values, q))
        assert stats.quantile(values, q / 100) == pytest.approx(np.percentile(values, q))


def test_a_percentile_reaching_an_unfinished_request_is_inf_and_none_is_nan() -> None:
    assert stats.percentile([1.0, 2.0, math.inf], 100) == math.inf
    assert stats.percentile([1.0, 2.0, math.inf], 25) == pytest.approx(1.5)
    assert math.isnan(stats.percentile([], 50))


def test_cells_say_missing_infinite_and_shares_plainly() -> None:
    assert tables.fmt(1.234) == "1.23" and tables.fmt(1.234, 1) == "1.2"
    assert tables.fmt(None) == tables.fmt(math.nan) == "-"
    assert tables.fmt(math.inf) == "inf" and tables.fmt(math.inf, inf="overload") == "overload"
    assert tables.pct(0.1234) == "12.3 %" and tables.pct(None) == "-"
    assert tables.signed_pct(-0.05) == "-5.0 %" and tables.signed_pct(0.05) == "+5.0 %"
    assert tables.signed_pct(math.nan) == "-"


def test_a_markdown_table_aligns_figures_right() -> None:
    text = tables.markdown_table(["policy", "req/s"], [["block", "12.5"], ["random", "9.0"]])
    assert text.splitlines() == ["| policy | req/s |", "|---|---:|", "| block | 12.5 |",
                                 "| random | 9.0 |"]


def test_print_table_prints_markdown_or_a_terminal_table(capsys: pytest.CaptureFixture) -> None:
    tables.print_table("Capacity", ["policy", "req/s"], [["block", "12.5"]], markdown=True)
    assert capsys.readouterr().out.splitlines()[1:] == ["**Capacity**", "", "| policy | req/s |",
                                                        "|---|---:|", "| block | 12.5 |"]
    tables.print_table("Capacity", ["policy", "req/s"], [["block", "12.5"]], width=60)
    out = capsys.readouterr().out
    assert "Capacity" in out and "block" in out and "12.5" in out


def test_paths_point_into_the_checkout() -> None:
    assert (paths.ROOT / "pyproject.toml").is_file()
    assert (paths.ROOT / "benchmarks" / "paths.py").is_file()
    assert paths.tiny_model("tiny-qwen") == paths.ROOT / ".blockq" / "models" / "tiny-qwen"
    assert paths.DATA_DIR == paths.ROOT.parent / "shared" / "data"


def test_service_arguments_default_to_the_benchmarks_own_services() -> None:
    parser = argparse.ArgumentParser()
    local.add_service_arguments(parser, model_path=True)
    args = parser.parse_args([])
    assert args.database_url.endswith("/blockq_bench") and args.redis_url.endswith("/14")
    assert args.model_path == paths.TINY_MODEL
    assert parser.parse_args(["--redis-url", "redis://127.0.0.1:6379/9"]).redis_url.endswith("/9")


def test_a_stack_sees_the_settings_not_the_callers_blockq_variables(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("BLOCKQ_ROUTING_POLICY", "random")
    monkeypatch.setenv("HOME_OF_THE_TEST", "kept")
    settings = Settings(data_dir=tmp_path, routing_policy="least_requests")
    env = local.stack_environment(settings)
    assert env["BLOCKQ_ROUTING_POLICY"] == "least_requests"
    assert env["HOME_OF_THE_TEST"] == "kept"
