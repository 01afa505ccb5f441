"""Our scheduler model against vLLM's own as the cluster benchmark's ground truth.

The benchmark lives in `benchmarks.ground_truth`; this is its command line.

    .venv/bin/python scripts/bench_ground_truth.py --model llama-2-7b-a30 --rates 24:34:2
    .venv/bin/python scripts/bench_ground_truth.py --smoke
"""

from benchmarks.ground_truth import main

if __name__ == "__main__":
    main()
