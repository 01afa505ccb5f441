"""Build the "conversations" replay workload: held-out real prompts, real answer lengths, and the
predictions of a length model that never saw them.

The benchmark lives in `benchmarks.live_workload`; this is its command line.

    python scripts/make_live_workload.py [--out .blockq/live_workload] [--seed 0]
"""

from benchmarks.live_workload import main

if __name__ == "__main__":
    raise SystemExit(main())
