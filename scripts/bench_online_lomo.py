"""The online loop on a serving model the bootstrap never saw, offline and with real lengths.

For each serving model M of ../shared/data/conversations in turn:

- its prompts are split in `--folds` folds; each fold is in turn M's *next unseen prompts*
  (the test), the other folds, in a fixed random order, are M's requests as they arrive;
- the bootstrap head is trained on the other serving models' answers to every prompt but the
  test fold's (M is unknown to it: the pooled intercept);
- after N of M's requests, the loop's turn runs as in `workers.learn.loop.retrain_length_model`:
  the newest 20 % of the N history rows are held out, a candidate is trained on the rest plus
  the bootstrap rows, and promoted only if its MAE on the held-out slice beats the bootstrap's;
- reported: MAE in tokens on the test fold of the bootstrap and of the promoted head.

The encoder's embeddings are computed once (the loop reuses the active encoder too), so this
measures the head the loop trains and its acceptance test, not the stack. The bias watch's
serving-time correction is not part of it.

    python scripts/bench_online_lomo.py [--counts 50 100 200 400] [--folds 5]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workers.learn.loop import split_recent  # noqa: E402
from workers.predict.dataset import DEFAULT_DATA_DIR, build_rows  # noqa: E402
from workers.predict.encoder import Encoder  # noqa: E402
from workers.predict.features import TokenCounter  # noqa: E402
from workers.predict.length_model import (  # noqa: E402
    Design,
    LengthHead,
    TrainConfig,
    design_matrix,
    encoder_info,
    fit_head,
)

MAX_TOKENS = 4096


def _mae(head: LengthHead, design: Design, tokens: np.ndarray, index: np.ndarray) -> float:
    predicted = np.array([p.tokens for p in head.predict(design.take(index), MAX_TOKENS)])
    return float(np.abs(predicted - tokens[index]).mean())


def _fit(design: Design, tokens: np.ndarray, groups: np.ndarray, index: np.ndarray,
         info: dict, config: TrainConfig) -> LengthHead:
    head, _ = fit_head(design.take(index), tokens[index], groups[index], encoder_info=info,
                       config=config)
    return head


def run_model(model: str, design: Design, tokens: np.ndarray, groups: np.ndarray,
              counts: list[int], num_folds: int, info: dict, config: TrainConfig,
              holdout_share: float, seed: int, max_folds: int, repeats: list[int]
              ) -> list[dict]:
    models = np.array(design.models)
    own = np.flatnonzero(models == model)
    order = own[np.random.default_rng(seed).permutation(len(own))]
    results = []
    for k in range(min(num_folds, max_folds)):
        test = order[k::num_folds]
        arriving = np.array([i for i in order if i not in set(test)])
        test_prompts = set(groups[test])
        boot = np.array([i for i in range(len(tokens)) if models[i] != model
                         and groups[i] not in test_prompts])
        bootstrap = _fit(design, tokens, groups, boot, info, config)
        before = _mae(bootstrap, design, tokens, test)
        for n in counts:
            if n > len(arriving):
                continue
            older, holdout = split_recent(list(arriving[:n]), holdout_share)
            older, holdout = np.array(older), np.array(holdout)
            active_holdout = _mae(bootstrap, design, tokens, holdout)
            for repeat in repeats:  # the history rows counted `repeat` times in the retrain
                candidate = _fit(design, tokens, groups,
                                 np.concatenate([np.repeat(older, repeat), boot]), info, config)
                results.append({"model": model, "fold": k, "n": n, "repeat": repeat,
                                "test": len(test), "bootstrap": before,
                                "candidate": _mae(candidate, design, tokens, test),
                                "promoted": _mae(candidate, design, tokens, holdout)
                                < active_holdout})
                print(results[-1], flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--counts", type=int, nargs="+", default=[50, 100, 200, 400])
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--models", nargs="*", help="serving models to hold out (default: all "
                        "with at least 100 answers)")
    parser.add_argument("--max-folds", type=int, default=5, help="evaluate only the first folds")
    parser.add_argument("--repeats", type=int, nargs="+", default=[1],
                        help="weights of the history rows in the retrain (row repeats)")
    parser.add_argument("--holdout-share", type=float, default=0.2)
    parser.add_argument("--cache", type=Path, help="npz file to keep the embeddings in")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rows = [r for r in build_rows(args.data) if r.output_tokens >= 1]
    encoder = Encoder()
    if args.cache and args.cache.exists():
        saved = np.load(args.cache)
        design = Design(saved["embeddings"], saved["features"], tuple(r.model for r in rows))
    else:
        design = design_matrix([r.prompt for r in rows], [r.model for r in rows],
                               encoder=encoder, counter=TokenCounter())
        if args.cache:
            np.savez(args.cache, embeddings=design.embeddings, features=design.features)
    tokens = np.array([r.output_tokens for r in rows], dtype=np.float64)
    groups = np.array([r.prompt_id for r in rows])
    names = args.models or sorted(m for m in set(design.models)
                                  if design.models.count(m) >= 100)
    results = []
    for model in names:
        results += run_model(model, design, tokens, groups, args.counts, args.folds,
                             encoder_info(encoder), TrainConfig(), args.holdout_share,
                             args.seed, args.max_folds, args.repeats)
    print("\n| held-out serving model | answers | history weight | after N requests "
          "| test answers (sum of folds) | bootstrap MAE | promoted MAE | change "
          "| folds promoted |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model, repeat, n in itertools.product(names, args.repeats, args.counts):
        cell = [r for r in results
                if r["model"] == model and r["n"] == n and r["repeat"] == repeat]
        if not cell:
            continue
        test = sum(r["test"] for r in cell)
        boot = sum(r["bootstrap"] * r["test"] for r in cell) / test
        after = sum((r["candidate"] if r["promoted"] else r["bootstrap"]) * r["test"]
                    for r in cell) / test
        print(f"| {model} | {design.models.count(model)} | {repeat} | {n} | {test} "
              f"| {boot:.1f} | {after:.1f} | {after / boot - 1:+.1%} "
              f"| {sum(r['promoted'] for r in cell)}/{len(cell)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
