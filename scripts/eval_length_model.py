"""Evaluate the output-length model against baselines on held-out prompts, and time it.

The benchmark lives in `benchmarks.length_eval`; this is its command line.

    python scripts/eval_length_model.py [--data DIR] [--rows FILE ...] [--split cv|holdout|lomo]
    python scripts/eval_length_model.py --cost [--sweep] [--batch-size 32] [--num-prompts 512]
"""

from benchmarks.length_eval import main

if __name__ == "__main__":
    raise SystemExit(main())
