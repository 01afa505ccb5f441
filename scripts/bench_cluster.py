"""Cluster benchmark: routing policies on N simulated instances, capacity under a TTFT SLO.

The benchmark lives in `benchmarks.cluster`; this is its command line.

    python scripts/bench_cluster.py --fleet '[{"model": "llama-2-7b", "count": 4,
    python scripts/bench_cluster.py [--models llama-2-7b-a30 qwen2-7b-a30]
    python scripts/bench_cluster.py --replot FILE [--markdown] [--plot-dir docs/img]
    python scripts/bench_cluster.py --fleet FLEET --workload-file FILE [--rate-scale X]
"""

from benchmarks.cluster import main

if __name__ == "__main__":
    main()
