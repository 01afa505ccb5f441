"""Measure the learned length model's held-out errors and save them as the cluster benchmark's
``learned-errors`` fixture (``workers/cluster_sim/data/learned_length_errors.json``).

The benchmark lives in `benchmarks.length_error_fixture`; this is its command line.

    python scripts/make_length_error_fixture.py [--data DIR] [--bins 10] [--out FILE]
    python scripts/make_length_error_fixture.py --bins 5 \\
        --from-replay .blockq/live_workload/requests.jsonl
"""

from benchmarks.length_error_fixture import main

if __name__ == "__main__":
    raise SystemExit(main())
