"""The soak's resource sampling (benchmarks/chaos/resources.py): a process's memory and
descriptors count its children, and growth is read per process name across restarts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.chaos.resources import growth_rows, plot_resources, tree_usage


def test_a_process_tree_counts_its_childrens_descriptors_and_a_gone_one_is_none(
        tmp_path: Path) -> None:
    opened = tmp_path / "opened"
    # A child holding 50 more descriptors than a bare interpreter, until its stdin closes.
    holder = ("import sys; files = [open(sys.argv[1], 'w') for _ in range(50)]; "
              "print('ready', flush=True); sys.stdin.read()")
    bare = subprocess.Popen([sys.executable, "-c", "import sys; print('ready', flush=True); "
                             "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; child = subprocess.Popen([sys.executable,"
         " '-c', sys.argv[1], sys.argv[2]], stdin=sys.stdin); print('ready', flush=True); "
         "child.wait()", holder, str(opened)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert bare.stdout is not None and parent.stdout is not None
        assert bare.stdout.readline() == b"ready\n"
        assert parent.stdout.readline() == b"ready\n"  # the parent's, then its child's
        assert parent.stdout.readline() == b"ready\n"
        alone, tree = tree_usage(bare.pid), tree_usage(parent.pid)
        assert alone is not None and tree is not None
        assert tree[1] >= alone[1] + 50  # the child's files are the tree's
        assert tree[0] > alone[0]  # two interpreters' memory
    finally:
        for process in (bare, parent):
            process.communicate(timeout=30)
    assert tree_usage(bare.pid) is None


def _sample(t_s: float, pid: int, rss_mb: float, fds: int) -> dict:
    return {"t_s": t_s, "at": 1000.0 + t_s, "postgres_mb": 10.0 + t_s / 100, "redis_mb": 1.0,
            "redis_keys": 5, "processes": {"api": {"pid": pid, "rss_mb": rss_mb, "fds": fds}}}


def test_growth_compares_the_second_tenth_with_the_last_and_counts_restarts(
        tmp_path: Path) -> None:
    # 100 samples: warm-up growth in the first tenth, flat after; a restart at sample 50.
    samples = [_sample(i * 30.0, 7 if i < 50 else 8, 100.0 + min(i, 10), 40 + (i >= 90))
               for i in range(100)]
    (row,) = growth_rows(samples)
    assert row["process"] == "api" and row["restarts"] == 1
    assert (row["rss_mb_early"], row["rss_mb_late"], row["rss_mb_max"]) == (110.0, 110.0, 110.0)
    assert (row["fds_early"], row["fds_late"], row["fds_max"]) == (40, 41, 41)
    assert growth_rows(samples[:9]) == []  # too few samples to split in tenths
    plot = tmp_path / "soak.png"
    plot_resources(samples, [1000.0 + 600, 1000.0 + 1200], plot)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
