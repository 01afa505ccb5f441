"""Predicted-shortest-first inside engines vs FCFS: mean and p99 latency at the same load.

The benchmark lives in `benchmarks.psf`; this is its command line.

    python scripts/bench_psf.py [--models qwen2-7b-a30 llama-2-7b-a30] [--num-requests 4000]
"""

from benchmarks.psf import main

if __name__ == "__main__":
    main()
