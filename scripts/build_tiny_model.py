"""Build the tiny random-weight models that tests and demos serve with vLLM.

The benchmark lives in `benchmarks.artifacts.tiny_model`; this is its command line.

    python scripts/build_tiny_model.py --out .blockq/models/tiny-llama [--force]
    python scripts/build_tiny_model.py --arch qwen2 --out .blockq/models/tiny-qwen
"""

import sys

from benchmarks.artifacts.tiny_model import main

if __name__ == "__main__":
    sys.exit(main())
