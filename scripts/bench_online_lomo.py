"""The online loop on a serving model the bootstrap never saw, offline and with real lengths.

The benchmark lives in `benchmarks.online_lomo`; this is its command line.

    python scripts/bench_online_lomo.py [--counts 50 100 200 400] [--folds 5]
"""

from benchmarks.online_lomo import main

if __name__ == "__main__":
    raise SystemExit(main())
