"""Does releasing a batch's lines by prefix group let the engines' prefix cache serve them?

The benchmark lives in `benchmarks.batch_prefix_groups`; this is its command line.

    .venv/bin/python scripts/bench_batch_prefix_groups.py --lines 2000 --prefixes 20
"""

from benchmarks.batch_prefix_groups import main

if __name__ == "__main__":
    raise SystemExit(main())
