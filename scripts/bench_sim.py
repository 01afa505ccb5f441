"""Time one what-if prediction (`workers.sim.predict_what_if`) on realistic instance snapshots.

The benchmark lives in `benchmarks.sim`; this is its command line.

    python scripts/bench_sim.py [--data DIR] [--model NAME] [--sizes 8 24 48]
"""

from benchmarks.sim import main

if __name__ == "__main__":
    main()
