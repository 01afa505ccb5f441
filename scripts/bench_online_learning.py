"""Online learning, measured in the running stack: a length model trained on one answer model
serves another; the loop retrains it from the request history and promotes it.

The benchmark lives in `benchmarks.online_learning`; this is its command line.

    .venv/bin/python scripts/bench_online_learning.py --instances 4 --rate 12 --time-scale 0.5
"""

from benchmarks.online_learning import main

if __name__ == "__main__":
    raise SystemExit(main())
