"""The online loop on a serving model the bootstrap never saw, offline and with real lengths.

For each serving model M of ../shared/data/conversations in turn:

- its prompts are split in `--folds` folds; each fold is in turn M's *next unseen prompts*
  (the test), the other folds, in a fixed random order, are M's requests as they arrive;
- the bootstrap head is trained on the other serving models' answers to every prompt but the
  test fold's (M is unknown to it: the pooled intercept);
- after N of M's requests, one turn of the loop runs on those N history rows, by `--methods`:
  - `correction` (the loop's default): `workers.learn.loop.correction_turn`, the very function
    `retrain_length_model` calls: M's own correction (intercept, scale, prompt weights, chosen
    by time-ordered cross-validation) on the bootstrap head, judged by the paired test on the
    history rows past the first time block, each predicted from older rows only;
  - `intercept`: the same turn with the correction limited to a shrunk intercept;
  - `refit` (the loop before 2026-12-02): the whole head retrained on the older 80 % of the N
    rows plus the bootstrap rows, judged on the newest 20 % (`--refit-confidence 0`: promoted
    when its MAE there is lower, the old rule);
- reported: MAE in tokens on the test fold of the bootstrap and of the model in use after the
  turn (the candidate if promoted, else the bootstrap), pooled over the folds; and the wrong
  calls of the acceptance test: candidates promoted that are worse on the test fold, and kept
  that are better.

The encoder's embeddings are computed once (the loop reuses the active encoder too), so this
measures the head the loop trains and its acceptance test, not the stack. The bias watch's
serving-time correction is not part of it.

    python scripts/bench_online_lomo.py [--counts 50 100 200 400] [--folds 5]
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import numpy as np

from benchmarks.tables import print_table
from workers.learn.correction import CorrectionConfig
from workers.learn.loop import LoopConfig, correction_turn, paired_verdict, split_recent
from workers.predict.dataset import DEFAULT_DATA_DIR, build_rows
from workers.predict.encoder import Encoder
from workers.predict.features import TokenCounter
from workers.predict.length_model import (
    Design,
    LengthHead,
    TrainConfig,
    design_matrix,
    encoder_info,
    fit_head,
)

MAX_TOKENS = 4096


def _tokens(head: LengthHead, design: Design, index: np.ndarray) -> np.ndarray:
    return np.array([p.tokens for p in head.predict(design.take(index), MAX_TOKENS)],
                    dtype=np.float64)


def _mae(head: LengthHead, design: Design, tokens: np.ndarray, index: np.ndarray) -> float:
    return float(np.abs(_tokens(head, design, index) - tokens[index]).mean())


def _fit(design: Design, tokens: np.ndarray, groups: np.ndarray, index: np.ndarray,
         info: dict, config: TrainConfig) -> LengthHead:
    head, _ = fit_head(design.take(index), tokens[index], groups[index], encoder_info=info,
                       config=config)
    return head


def _turn(method: str, model: str, bootstrap: LengthHead, design: Design, tokens: np.ndarray,
          groups: np.ndarray, history: np.ndarray, boot: np.ndarray, info: dict,
          args: argparse.Namespace) -> tuple[LengthHead, bool, float, int]:
    """(candidate, promoted, paired-test confidence, rows judged) of one turn of the loop."""
    if method == "refit":
        older, holdout = split_recent(list(history), args.holdout_share)
        older, holdout = np.array(older), np.array(holdout)
        candidate = _fit(design, tokens, groups, np.concatenate([older, boot]), info,
                         TrainConfig())
        verdict = paired_verdict(
            np.abs(_tokens(candidate, design, holdout) - tokens[holdout]),
            np.abs(_tokens(bootstrap, design, holdout) - tokens[holdout]),
            min_confidence=args.refit_confidence)
        return candidate, verdict.promote, verdict.confidence, verdict.rows
    correction = CorrectionConfig() if method == "correction" else CorrectionConfig(
        penalties=(), scale=False)
    config = LoopConfig(min_confidence=args.min_confidence, correction=correction)
    history_design = design.take(history)
    turn = correction_turn(bootstrap, history_design, tokens[history], MAX_TOKENS,
                           _tokens(bootstrap, design, history), model=model, config=config)
    return turn.candidate, turn.verdict.promote, turn.verdict.confidence, turn.verdict.rows


def run_model(model: str, design: Design, tokens: np.ndarray, groups: np.ndarray,
              info: dict, args: argparse.Namespace) -> list[dict]:
    models = np.array(design.models)
    own = np.flatnonzero(models == model)
    order = own[np.random.default_rng(args.seed).permutation(len(own))]
    results = []
    for k in range(min(args.folds, args.max_folds)):
        test = order[k::args.folds]
        arriving = np.array([i for i in order if i not in set(test)])
        test_prompts = set(groups[test])
        boot = np.array([i for i in range(len(tokens)) if models[i] != model
                         and groups[i] not in test_prompts])
        started = time.process_time()
        bootstrap = _fit(design, tokens, groups, boot, info, TrainConfig())
        fit_cpu = time.process_time() - started
        before = _mae(bootstrap, design, tokens, test)
        for n, method in itertools.product(args.counts, args.methods):
            if n > len(arriving):
                continue
            started = time.process_time()
            candidate, promoted, confidence, judged = _turn(
                method, model, bootstrap, design, tokens, groups, arriving[:n], boot, info, args)
            results.append({"model": model, "fold": k, "n": n, "method": method,
                            "test": len(test), "bootstrap": before,
                            "candidate": _mae(candidate, design, tokens, test),
                            "promoted": promoted, "confidence": round(confidence, 3),
                            "judged": judged, "bootstrap_fit_cpu_s": round(fit_cpu, 1),
                            "turn_cpu_s": round(time.process_time() - started, 2)})
            print(results[-1], flush=True)
    return results


def _table(results: list[dict], names: list[str], design: Design, args: argparse.Namespace,
           folds: int) -> None:
    rows = []
    for model, n, method in itertools.product(names, args.counts, args.methods):
        cell = [r for r in results if r["model"] == model and r["n"] == n
                and r["method"] == method and r["fold"] < folds]
        if not cell:
            continue
        test = sum(r["test"] for r in cell)
        boot = sum(r["bootstrap"] * r["test"] for r in cell) / test
        after = sum((r["candidate"] if r["promoted"] else r["bootstrap"]) * r["test"]
                    for r in cell) / test
        wrong_in = sum(r["promoted"] and r["candidate"] > r["bootstrap"] for r in cell)
        wrong_out = sum(not r["promoted"] and r["candidate"] < r["bootstrap"] for r in cell)
        rows.append((model, str(design.models.count(model)), method, str(n), str(test),
                     f"{boot:.1f}", f"{after:.1f}", f"{after / boot - 1:+.1%}",
                     f"{sum(r['promoted'] for r in cell)}/{len(cell)}",
                     f"{wrong_in} / {wrong_out}"))
    print_table("", ("held-out serving model", "answers", "method", "after N requests",
                     f"test answers (folds {folds})", "bootstrap MAE", "MAE after the turn",
                     "change", "promoted", "promoted but worse / kept but better"),
                rows, markdown=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--counts", type=int, nargs="+", default=[50, 100, 200, 400])
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--models", nargs="*", help="serving models to hold out (default: all "
                        "with at least 100 answers)")
    parser.add_argument("--max-folds", type=int, default=5, help="evaluate only the first folds")
    parser.add_argument("--methods", nargs="+", default=["correction"],
                        choices=["correction", "intercept", "refit"])
    parser.add_argument("--min-confidence", type=float, default=LoopConfig().min_confidence,
                        help="paired-test confidence a correction needs to be promoted")
    parser.add_argument("--refit-confidence", type=float, default=0.0,
                        help="the same for method refit (0: the old rule, lower MAE)")
    parser.add_argument("--table-folds", type=int, nargs="*", default=[],
                        help="also print the table over only the first K folds")
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
        results += run_model(model, design, tokens, groups, encoder_info(encoder), args)
    for folds in [*args.table_folds, min(args.folds, args.max_folds)]:
        _table(results, names, design, args, folds)
    return 0
