"""Distil the static prompt encoder from the packaged MiniLM (`workers.predict.static_encoder`).

Every vocabulary token is embedded once through the model, the vectors are reduced by PCA and
written as int8 with the tokenizer: the matrix the length model's default encoder reads.

Usage::

    python scripts/distill_static_encoder.py                 # rebuild the shipped matrix
    python scripts/distill_static_encoder.py --dim 64 --out build/static64.npz
"""

from __future__ import annotations

import argparse
from pathlib import Path

from workers.predict.static_encoder import STATIC_ARTIFACT, distill


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", default=None,
                        help="local Hugging Face encoder directory (default: all-MiniLM-L6-v2)")
    parser.add_argument("--dim", type=int, default=128, help="principal components kept")
    parser.add_argument("--out", type=Path, default=STATIC_ARTIFACT)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    encoder = distill(args.encoder, dim=args.dim, num_threads=args.threads)
    path = encoder.save(args.out)
    print(f"{encoder.name}: {encoder.matrix.shape[0]} tokens x {encoder.dim} dims "
          f"(PCA keeps {encoder.source['pca_explained']:.1%} of the variance), "
          f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
