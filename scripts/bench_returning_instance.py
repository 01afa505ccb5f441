"""Where work goes when an instance returns empty beside a backlogged pool: the rebalance's
what-if against the count rule, and the policies the bias watch could fall back to.

The analysis lives in `benchmarks.returning_instance`; this is its command line (pure, no
services; deterministic counts, so it may run on a busy machine).

    .venv/bin/python scripts/bench_returning_instance.py
"""

from benchmarks.returning_instance import main

if __name__ == "__main__":
    raise SystemExit(main())
