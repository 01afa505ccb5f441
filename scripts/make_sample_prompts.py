"""Derive the demo's sample prompts (app/demo/sample_prompts.jsonl) from real conversations.

The benchmark lives in `benchmarks.artifacts.sample_prompts`; this is its command line.

    python scripts/make_sample_prompts.py [--data-dir DIR] [--out FILE] [--count N] [--seed S]
"""

import sys

from benchmarks.artifacts.sample_prompts import main

if __name__ == "__main__":
    sys.exit(main())
