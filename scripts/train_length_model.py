"""Train the output-length model from JSONL rows, or build those rows from the bootstrap data.

The benchmark lives in `benchmarks.artifacts.length_head`; this is its command line.

    python scripts/train_length_model.py
    python scripts/train_length_model.py --encoder static
    python scripts/train_length_model.py --export-rows build/length_rows
    python scripts/train_length_model.py --rows a.jsonl b.jsonl --out build/length.npz
"""

from benchmarks.artifacts.length_head import main

if __name__ == "__main__":
    raise SystemExit(main())
