"""Fidelity of the instance simulator against real vLLM: predicted vs actual TTFT and latency.

The benchmark lives in `benchmarks.sim_fidelity`; this is its command line.

    python scripts/bench_sim_fidelity.py [--model-dir DIR] [--data DIR] [--rates 8 16 24 32]
"""

from benchmarks.sim_fidelity import main

if __name__ == "__main__":
    main()
