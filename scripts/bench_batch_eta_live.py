"""When will this batch be done, on the emulated fleet? (issue 43) The stack's own completion
estimates of 12 batches of unlike content, at validation and at 25 %, against when each
really finished, beside an interactive stream.

The benchmark lives in `benchmarks.batch_eta_live`; this is its command line. It measures
time: run it alone.

    .venv/bin/python scripts/bench_batch_eta_live.py [--lines 1000] [--time-scale 1.0]
        [--rate 2.0] [--window 192] [--markdown] [--json OUT]
"""

from benchmarks.batch_eta_live import main

if __name__ == "__main__":
    raise SystemExit(main())
