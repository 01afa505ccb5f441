"""CPU per request of the control plane on emulated engines (issue 14, item 6): no GPU, no vLLM.

The benchmark lives in `benchmarks.control_plane_cpu`; this is its command line.

    .venv/bin/python scripts/bench_control_plane_cpu.py --rate 5 --duration-s 60
"""

from benchmarks.control_plane_cpu import main

if __name__ == "__main__":
    raise SystemExit(main())
