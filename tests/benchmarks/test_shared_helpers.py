"""The benchmarks' shared helpers: percentiles, table cells and tables, paths, the quiet-machine
wait and the measurement lock."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks import paths, stats, tables


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
