"""How many held connections one API process takes, and what each costs (issue 30, item 1).

The benchmark lives in `benchmarks.held_connections`; this is its command line.

    .venv/bin/python scripts/bench_held_connections.py --streams 2000
"""

from benchmarks.held_connections import main

if __name__ == "__main__":
    raise SystemExit(main())
