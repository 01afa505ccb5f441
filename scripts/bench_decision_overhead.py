"""Decision overhead of the real pipeline: time from entering predict to the publish on gpu.<k>.

The benchmark lives in `benchmarks.decision_overhead`; this is its command line.

    .venv/bin/python scripts/bench_decision_overhead.py --instances 12 --requests 400 --rate 20
"""

from benchmarks.decision_overhead import main

if __name__ == "__main__":
    raise SystemExit(main())
