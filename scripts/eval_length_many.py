"""Evaluate the length model on many models' answers (``lengths/`` in the shared data folder).

The benchmark lives in `benchmarks.length_eval_many`; this is its command line.

    python scripts/eval_length_many.py [--data DIR] [--folds 5] [--encoders static minilm features]
    python scripts/eval_length_many.py --new-models 20 [--folds 3]
    python scripts/eval_length_many.py --cost [--num-prompts 512]
"""

from benchmarks.length_eval_many import main

if __name__ == "__main__":
    raise SystemExit(main())
