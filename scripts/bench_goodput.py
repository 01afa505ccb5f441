"""Goodput under mixed per-request latency targets: requests that met their targets per second.

The benchmark lives in `benchmarks.goodput`; this is its command line.

    python scripts/bench_goodput.py [--model llama-2-7b-a30] [--rates 24 28 32 36 40]
"""

from benchmarks.goodput import main

if __name__ == "__main__":
    main()
