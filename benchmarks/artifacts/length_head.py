"""Train the output-length model from JSONL rows, or build those rows from the bootstrap data.

Rows are JSON objects with ``prompt`` (text or chat messages), ``model`` (the serving model),
``output_tokens`` and optionally ``prompt_id`` (answers sharing it stay in one fold). Several
``--rows`` files are concatenated, e.g. the bootstrap rows plus an export of the request history.

The shipped artifact is trained on ``lengths/alpaca_eval_many_models.jsonl`` (534 AlpacaEval
prompts, 224 models' answers; licence CC BY-NC 4.0, recorded in the artifact), once per encoder:
on MiniLM (``length_bootstrap.npz``) and on the static encoder (``--encoder static``,
``length_bootstrap_static.npz``, for CPUs without AMX). ``--conversations`` trains
on the older ``conversations/`` rows (7 models) instead.
``blockq models length-train`` trains the same way from any JSONL file.

Usage::

    # the shipped bootstrap models
    python scripts/train_length_model.py
    python scripts/train_length_model.py --encoder static
    # write the bootstrap rows (all, and a split by prompt) to reuse or inspect
    python scripts/train_length_model.py --export-rows build/length_rows
    # train from JSONL rows into another artifact
    python scripts/train_length_model.py --rows a.jsonl b.jsonl --out build/length.npz
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from workers.predict.dataset import (
    ALPACA_EVAL_LICENCE,
    ALPACA_EVAL_SOURCE,
    DEFAULT_DATA_DIR,
    MANY_MODELS,
    build_rows,
    read_many_models,
    read_rows,
    split_by_prompt,
    write_rows,
)
from workers.predict.encoder import Encoder, EncoderConfig
from workers.predict.length_model import TrainConfig, bootstrap_artifact, train
from workers.predict.static_encoder import StaticEncoder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR,
                        help="shared data folder (default: ../shared/data beside the repo)")
    parser.add_argument("--rows", type=Path, nargs="*", default=None,
                        help="JSONL row files to train on instead of building from --data")
    parser.add_argument("--out", type=Path, default=None,
                        help="artifact to write (.npz; a .json summary is written beside it; "
                             "default: the shipped head of --encoder minilm or static)")
    parser.add_argument("--export-rows", type=Path, default=None, metavar="DIR",
                        help="write rows.jsonl, train.jsonl and test.jsonl to DIR and stop")
    parser.add_argument("--test-share", type=float, default=0.2,
                        help="share of prompts in test.jsonl for --export-rows")
    parser.add_argument("--conversations", action="store_true",
                        help="train on the conversations/ rows instead of lengths/")
    parser.add_argument("--licence", default=None,
                        help="licence of --rows, recorded in the artifact")
    parser.add_argument("--encoder", default="minilm",
                        help="'minilm' (the packaged MiniLM, default), 'static' (the distilled "
                             "matrix) or a local Hugging Face encoder directory")
    parser.add_argument("--max-seq-len", type=int, default=EncoderConfig().max_seq_len)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    args = parser.parse_args(argv)
    if args.out is None:
        if args.encoder not in ("minilm", "static"):
            parser.error("--out is required with an encoder directory")
        args.out = bootstrap_artifact(args.encoder)
    console = Console(width=100)

    if args.rows:
        rows = [row for path in args.rows for row in read_rows(path)]
        sources = [{"name": ", ".join(p.name for p in args.rows),
                    "licence": args.licence or "not stated (the rows' own terms apply)",
                    "rows": len(rows)}]
    elif args.conversations:
        rows = build_rows(args.data)
        sources = [{"name": "conversations/ (Arena-Hard, arena-bench, ShareGPT sample)",
                    "licence": "Apache-2.0 / MIT repositories; the model providers' output "
                               "terms apply (see the data folder's SOURCES.md)",
                    "rows": len(rows)}]
    else:
        rows = read_many_models(args.data / MANY_MODELS)
        sources = [{"name": ALPACA_EVAL_SOURCE, "licence": ALPACA_EVAL_LICENCE,
                    "rows": len(rows)}]
    console.print(f"{len(rows)} rows, {len({r.prompt_id for r in rows})} prompts, "
                  f"{len({r.model for r in rows})} models")

    if args.export_rows:
        train_rows, test_rows = split_by_prompt(rows, test_share=args.test_share)
        for name, part in (("rows", rows), ("train", train_rows), ("test", test_rows)):
            count = write_rows(args.export_rows / f"{name}.jsonl", part)
            console.print(f"wrote {count} rows to {args.export_rows / f'{name}.jsonl'}")
        return 0

    if args.encoder == "static":
        encoder = StaticEncoder.load()
    else:
        encoder = Encoder(EncoderConfig(path=None if args.encoder == "minilm" else args.encoder,
                                        max_seq_len=args.max_seq_len, num_threads=args.threads))
    started = time.perf_counter()
    predictor, metrics = train(rows, encoder=encoder, config=TrainConfig(), sources=sources)
    elapsed = time.perf_counter() - started
    path = predictor.head.save(args.out)

    console.print(f"{predictor.name}: out-of-fold metrics ({metrics['num_folds']} folds by "
                  f"prompt), trained in {elapsed:.0f} s")
    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in metrics.items():
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    for source in sources:
        console.print(f"source: {source['name']}, licence {source['licence']}")
    console.print(table)
    console.print(f"saved {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0
