"""How close is a batch's completion estimate, at validation and at 25 %, to a replay of the
batch, beside a per-model-mean estimate's? (issue 43)

The benchmark lives in `benchmarks.batch_eta`; this is its command line.

    .venv/bin/python scripts/bench_batch_eta.py [--lines 300] [--rate 2.0] [--markdown]
"""

from benchmarks.batch_eta import main

if __name__ == "__main__":
    raise SystemExit(main())
