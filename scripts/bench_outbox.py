"""What the transactional outbox costs one hand-off between stages, on PostgreSQL and Redis.

The benchmark lives in `benchmarks.outbox`; this is its command line.

    .venv/bin/python scripts/bench_outbox.py --handoffs 1000
"""

from benchmarks.outbox import main

if __name__ == "__main__":
    raise SystemExit(main())
