"""Interactive latency while a bulk batch runs, against the same traffic with no batch, in one run.

The benchmark lives in `benchmarks.batch_interference`; this is its command line.

    .venv/bin/python scripts/bench_batch_interference.py --instances 4 --rate 4 --duration 60
"""

from benchmarks.batch_interference import main

if __name__ == "__main__":
    raise SystemExit(main())
