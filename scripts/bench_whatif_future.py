"""The what-if's blind spot alone, in simulated time: with and without the expected future load.

The benchmark lives in `benchmarks.whatif_future`; this is its command line.

    python scripts/bench_whatif_future.py [--setup a30] [--rates 1 2 3 4]
"""

from benchmarks.whatif_future import main

if __name__ == "__main__":
    main()
