"""Fit the execution-time models shipped in ``workers/sim/models`` from Vidur profiling CSVs.

The benchmark lives in `benchmarks.artifacts.exec_models`; this is its command line.

    python scripts/fit_exec_model.py [--data DIR] [--out DIR] [--seed S]
"""

from benchmarks.artifacts.exec_models import main

if __name__ == "__main__":
    main()
