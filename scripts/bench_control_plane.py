"""The control plane's cost, as a user feels it and as an operator pays for it (issues 14 and 30).

The benchmark lives in `benchmarks.control_plane`; this is its command line.

    .venv/bin/python scripts/bench_control_plane.py                     # the full run
    .venv/bin/python scripts/bench_control_plane.py --smoke             # a quick check
"""

from benchmarks.control_plane import main

if __name__ == "__main__":
    raise SystemExit(main())
