"""Does a batch alone on an idle emulated fleet run as fast as the fleet can run its lines?
(issue 43) Its lines a second against the simulator's saturated rate, and the stack's
completion estimate at validation against the batch's real completion.

The benchmark lives in `benchmarks.batch_alone`; this is its command line. It measures time:
run it alone.

    .venv/bin/python scripts/bench_batch_alone.py [--instances 3] [--lines 2000]
        [--time-scale 0.1] [--max-tokens 512] [--window 256] [--markdown]
"""

from benchmarks.batch_alone import main

if __name__ == "__main__":
    raise SystemExit(main())
