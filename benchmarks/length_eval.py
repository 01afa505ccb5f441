"""Evaluate the output-length model against baselines on held-out prompts, and time it.

Quality: rows from ../shared/data/conversations (or ``--rows``), split by prompt (never by
pair). With ``--split cv`` (default) every prompt is held out once across K folds and the
metrics pool all out-of-fold predictions; ``--split holdout`` uses the fixed 80/20 split of
`dataset.split_by_prompt`; ``--split lomo`` holds out each serving model in turn (none of its
answers in training, so it is an unknown model to every method) crossed with the K prompt folds,
so the test answers are to prompts no method saw either. Every method trains on the training
side only: global mean, per-model mean and median, a log-log prompt-length regression (with
per-model intercepts), features-only gradient boosting (sklearn HistGradientBoostingRegressor on the
cheap features and the serving model), and the encoder model (`length_model.fit_head`, which
picks its penalty by an inner cross-validation on the training side). Predictions are capped at
4096 tokens.

Cost (``--cost``): loads the shipped artifact the way a predictor worker does, on one torch
thread, and times per-prompt latency unbatched and in batches on real prompts (Arena-Hard,
arena-bench and the 1,000 ShareGPT first turns), then reports the peak RSS of the process.

Usage::

    python scripts/eval_length_model.py [--data DIR] [--rows FILE ...] [--split cv|holdout|lomo]
                                        [--folds 5] [--markdown]
    python scripts/eval_length_model.py --cost [--sweep] [--batch-size 32] [--num-prompts 512]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from workers.predict.dataset import (
    DEFAULT_DATA_DIR,
    LengthRow,
    build_rows,
    load_benchmark_prompts,
    read_rows,
    split_by_prompt,
)
from workers.predict.encoder import Encoder, EncoderConfig
from workers.predict.features import FEATURE_NAMES, TokenCounter
from workers.predict.length_model import (
    Design,
    LengthPredictor,
    TrainConfig,
    bootstrap_artifact,
    design_matrix,
    encoder_info,
    fit_head,
    length_metrics,
)

MAX_TOKENS = 4096
BASELINES = ("global mean", "per-model mean", "per-model median", "prompt-length regression",
             "features-only gradient boosting")
REFERENCE = "reference: other models' real answers (not a predictor)"
#: (train index, test index) -> predicted tokens for the test rows.
Method = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _model_onehot(models: list[str]) -> np.ndarray:
    names = sorted(set(models))
    return np.eye(len(names))[[names.index(m) for m in models]]


def baselines(design: Design, tokens: np.ndarray) -> dict[str, Method]:
    """The baselines, each a function of (train rows, test rows)."""
    # NOTE: sklearn is imported here, not at module level, so that `--cost` measures the RSS
    # of a process that holds the predictor and nothing else.
    from sklearn.ensemble import HistGradientBoostingRegressor

    models = np.array(design.models)
    onehot = _model_onehot(list(design.models))
    log_tokens = np.log(tokens)
    log_prompt = design.features[:, FEATURE_NAMES.index("log_prompt_tokens")]

    def per_model(stat: Callable[[np.ndarray], float]) -> Method:
        def method(train: np.ndarray, test: np.ndarray) -> np.ndarray:
            fallback = stat(tokens[train])
            by_model = {m: stat(tokens[train][models[train] == m])
                        for m in np.unique(models[train])}
            return np.array([by_model.get(m, fallback) for m in models[test]])
        return method

    def length_regression(train: np.ndarray, test: np.ndarray) -> np.ndarray:
        seen = np.flatnonzero(onehot[train].sum(0) > 0)
        x = np.hstack([log_prompt[:, None], onehot[:, seen]])
        coef, *_ = np.linalg.lstsq(x[train], log_tokens[train], rcond=None)
        # A model absent from training gets the row-weighted mean intercept, as the encoder
        # model does.
        pooled = np.average(coef[1:], weights=onehot[train][:, seen].sum(0))
        intercept = np.where(onehot[test][:, seen].sum(1) > 0, x[test, 1:] @ coef[1:], pooled)
        return np.exp(coef[0] * log_prompt[test] + intercept)

    def boosting(train: np.ndarray, test: np.ndarray) -> np.ndarray:
        x = np.hstack([design.features, onehot])
        # NOTE: absolute error on log tokens (a median) beat squared error by 6% MAE here.
        model = HistGradientBoostingRegressor(loss="absolute_error", max_iter=300,
                                              learning_rate=0.05, min_samples_leaf=20,
                                              l2_regularization=1.0, random_state=0)
        return np.exp(model.fit(x[train], log_tokens[train]).predict(x[test]))

    return {
        "global mean": lambda train, test: np.full(len(test), tokens[train].mean()),
        "per-model mean": per_model(np.mean),
        "per-model median": per_model(np.median),
        "prompt-length regression": length_regression,
        "features-only gradient boosting": boosting,
    }


def other_answers_reference(design: Design, tokens: np.ndarray, groups: np.ndarray) -> Method:
    """Not a predictor: the real answers of the *other* models to the same prompt.

    It shows how much of an answer's length the prompt determines at all: the log length of
    each other answer minus its model's mean, averaged, plus this model's mean (means from the
    training side). Rows whose prompt has no other answer fall back to the model's mean.
    """
    models = np.array(design.models)
    log_tokens = np.log(tokens)

    def method(train: np.ndarray, test: np.ndarray) -> np.ndarray:
        bias = {m: log_tokens[train][models[train] == m].mean() for m in np.unique(models)
                if (models[train] == m).any()}
        fallback = log_tokens[train].mean()
        out = []
        for i in test:
            others = np.flatnonzero((groups == groups[i]) & (np.arange(len(groups)) != i))
            base = bias.get(models[i], fallback)
            shift = np.mean([log_tokens[j] - bias.get(models[j], fallback) for j in others]) \
                if len(others) else 0.0
            out.append(np.exp(base + shift))
        return np.array(out)

    return method


def encoder_method(design: Design, tokens: np.ndarray, groups: np.ndarray,
                   info: dict) -> tuple[Method, list[np.ndarray]]:
    uppers: list[np.ndarray] = []

    def method(train: np.ndarray, test: np.ndarray) -> np.ndarray:
        head, _ = fit_head(design.take(train), tokens[train], groups[train],
                           encoder_info=info, config=TrainConfig())
        predictions = head.predict(design.take(test), MAX_TOKENS)
        uppers.append(np.array([p.p90_tokens for p in predictions]))
        return np.array([p.tokens for p in predictions], dtype=np.float64)

    return method, uppers


def folds_of(rows: list[LengthRow], split: str, num_folds: int, seed: int = 0
             ) -> list[tuple[np.ndarray, np.ndarray]]:
    if split == "holdout":
        _, test_rows = split_by_prompt(rows, seed=seed)
        held = {id(r) for r in test_rows}
        mask = np.array([id(r) in held for r in rows])
        return [(np.flatnonzero(~mask), np.flatnonzero(mask))]
    prompt_ids = sorted({r.prompt_id for r in rows})
    random.Random(seed).shuffle(prompt_ids)
    fold_of = {p: i % num_folds for i, p in enumerate(prompt_ids)}
    fold = np.array([fold_of[r.prompt_id] for r in rows])
    if split == "lomo":
        # NOTE: the held-out model's prompts are held out too: with them in training (answered
        # by other models), a method could recall those answers' lengths, which a new serving
        # model's new prompts never offer.
        models = np.array([r.model for r in rows])
        return [(np.flatnonzero((models != m) & (fold != k)),
                 np.flatnonzero((models == m) & (fold == k)))
                for m in sorted(set(models)) for k in range(num_folds)]
    return [(np.flatnonzero(fold != k), np.flatnonzero(fold == k)) for k in range(num_folds)]


def quality(args: argparse.Namespace, console: Console) -> None:
    rows = [r for path in args.rows for r in read_rows(path)] if args.rows else build_rows(
        args.data)
    rows = [r for r in rows if r.output_tokens >= 1]
    encoder = Encoder(EncoderConfig(num_threads=args.threads))
    started = time.perf_counter()
    design = design_matrix([r.prompt for r in rows], [r.model for r in rows],
                           encoder=encoder, counter=TokenCounter())
    embed_s = time.perf_counter() - started
    tokens = np.array([r.output_tokens for r in rows], dtype=np.float64)
    groups = np.array([r.prompt_id for r in rows])
    methods = baselines(design, tokens)
    learned, uppers = encoder_method(design, tokens, groups, encoder_info(encoder))
    methods["encoder model (MiniLM + features)"] = learned

    methods[REFERENCE] = other_answers_reference(design, tokens, groups)

    folds = folds_of(rows, args.split, args.folds)
    test_index = np.concatenate([test for _, test in folds])
    results = {}
    for name, method in methods.items():
        predicted = np.concatenate([method(train, test) for train, test in folds])
        predicted = np.clip(np.rint(predicted), 1, MAX_TOKENS)
        results[name] = length_metrics(predicted, tokens[test_index])
    results["encoder model (MiniLM + features)"]["p90_coverage"] = float(
        (tokens[test_index] <= np.concatenate(uppers)).mean())

    best_baseline = min((m["mae_tokens"], n) for n, m in results.items()
                        if n in BASELINES)
    split = {"cv": f"{args.folds}-fold CV by prompt", "holdout": "80/20 holdout by prompt",
             "lomo": f"leave one serving model out x {args.folds} prompt folds"}[args.split]
    title = (f"Output-length prediction on held-out prompts ({split}; {len(test_index)} answers "
             f"to {len(set(groups[test_index]))} prompts, {len(set(design.models))} models)")
    table = Table(title=title)
    for column in ("method", "MAE (tokens)", "vs best baseline", "median rel. error",
                   "within ±25%", "Spearman"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for name, m in results.items():
        gain = 1.0 - m["mae_tokens"] / best_baseline[0]
        table.add_row(name, f"{m['mae_tokens']:.1f}", f"{gain:+.1%}",
                      f"{m['median_rel_error']:.3f}", f"{m['within_25pct']:.1%}",
                      f"{m['spearman']:.3f}")
    console.print(table)
    learned_metrics = results["encoder model (MiniLM + features)"]
    console.print(f"best baseline: {best_baseline[1]} ({best_baseline[0]:.1f} tokens); "
                  f"encoder model p90 coverage {learned_metrics['p90_coverage']:.1%}; "
                  f"embedding {len(set(groups))} prompts took {embed_s:.0f} s")
    if args.learning_curve:
        learning_curve(design, tokens, groups, folds, encoder_info(encoder), console)
    if args.markdown:
        print("\n| method | MAE (tokens) | vs best baseline | median rel. error | within ±25% "
              "| Spearman |\n|---|---:|---:|---:|---:|---:|")
        for name, m in results.items():
            gain = 1.0 - m["mae_tokens"] / best_baseline[0]
            print(f"| {name} | {m['mae_tokens']:.1f} | {gain:+.1%} | "
                  f"{m['median_rel_error']:.3f} | {m['within_25pct']:.1%} | "
                  f"{m['spearman']:.3f} |")


def learning_curve(design: Design, tokens: np.ndarray, groups: np.ndarray,
                   folds: list[tuple[np.ndarray, np.ndarray]], info: dict,
                   console: Console) -> None:
    """Encoder-model MAE when each fold trains on a share of its training prompts."""
    table = Table(title="Encoder model vs training prompts (same held-out folds)")
    for column in ("share of training prompts", "training prompts per fold", "MAE (tokens)"):
        table.add_column(column, justify="right")
    rng = np.random.default_rng(0)
    for share in (0.25, 0.5, 0.75, 1.0):
        predicted, actual, sizes = [], [], []
        for train, test in folds:
            prompts = np.unique(groups[train])
            kept = set(rng.permutation(prompts)[: max(2, round(share * len(prompts)))])
            subset = train[np.array([g in kept for g in groups[train]])]
            head, _ = fit_head(design.take(subset), tokens[subset], groups[subset],
                               encoder_info=info, config=TrainConfig())
            predicted += [p.tokens for p in head.predict(design.take(test), MAX_TOKENS)]
            actual += tokens[test].tolist()
            sizes.append(len(kept))
        mae = length_metrics(np.array(predicted), np.array(actual))["mae_tokens"]
        table.add_row(f"{share:.0%}", f"{np.mean(sizes):.0f}", f"{mae:.1f}")
    console.print(table)


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def cost(args: argparse.Namespace, console: Console) -> None:
    import torch  # here, not at the top: test collection imports this module

    rss_start = _peak_rss_mib()
    started = time.perf_counter()
    predictor = LengthPredictor.load(args.artifact, num_threads=1)
    load_s = time.perf_counter() - started
    rss_loaded = _peak_rss_mib()

    prompts = load_benchmark_prompts(args.data)
    random.Random(0).shuffle(prompts)
    prompts = prompts[: args.num_prompts]
    model = predictor.head.model_names[0]
    predictor.predict_batch(prompts[: args.batch_size], model, MAX_TOKENS)  # warm up kernels

    single_ms = []
    for prompt in prompts:
        t0 = time.perf_counter()
        predictor.predict(prompt, model, MAX_TOKENS)
        single_ms.append((time.perf_counter() - t0) * 1e3)
    t0, cpu0 = time.perf_counter(), time.process_time()
    for start in range(0, len(prompts), args.batch_size):
        predictor.predict_batch(prompts[start:start + args.batch_size], model, MAX_TOKENS)
    batched_ms = (time.perf_counter() - t0) * 1e3 / len(prompts)
    # NOTE: CPU time of this process (one torch thread): what a prediction costs its core when
    # other work shares the machine and stretches the wall-clock figure.
    batched_cpu_ms = (time.process_time() - cpu0) * 1e3 / len(prompts)

    counter = predictor.counter
    num_tokens = [counter(p) for p in prompts]
    table = Table(title=f"Length predictor cost on one core ({len(prompts)} real prompts, "
                        f"median {statistics.median(num_tokens):.0f} Qwen tokens, encoder "
                        f"{predictor.encoder.name} {str(predictor.encoder.dtype)[6:]}, "
                        f"max_seq_len {predictor.encoder.max_seq_len})")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row(f"batched ({args.batch_size} per call, passes of "
                  f"{predictor.encoder.config.batch_size}), per prompt", f"{batched_ms:.2f} ms")
    table.add_row("batched, CPU time of this process per prompt", f"{batched_cpu_ms:.2f} ms")
    table.add_row("unbatched, per prompt: mean", f"{statistics.fmean(single_ms):.2f} ms")
    table.add_row("unbatched, per prompt: p50 / p99",
                  f"{np.percentile(single_ms, 50):.2f} / {np.percentile(single_ms, 99):.2f} ms")
    table.add_row("load (encoder + head + tokenizer)", f"{load_s:.2f} s")
    table.add_row("peak RSS: interpreter + imports", f"{rss_start:.0f} MiB")
    table.add_row("peak RSS: after load", f"{rss_loaded:.0f} MiB")
    table.add_row("peak RSS: after predictions", f"{_peak_rss_mib():.0f} MiB")
    table.add_row("artifact size", f"{Path(args.artifact).stat().st_size / 1024:.0f} KiB")
    table.add_row("torch threads / machine load average (1 min)",
                  f"{torch.get_num_threads()} / {os.getloadavg()[0]:.1f}")
    console.print(table)
    if args.markdown:
        print(json.dumps({"batched_ms": batched_ms, "batched_cpu_ms": batched_cpu_ms,
                          "single_mean_ms": statistics.fmean(single_ms),
                          "single_p50_ms": float(np.percentile(single_ms, 50)),
                          "single_p99_ms": float(np.percentile(single_ms, 99)),
                          "peak_rss_mib": _peak_rss_mib(), "load_s": load_s}))


#: (label, encoder settings) timed by ``--cost --sweep``; the shipped defaults are the last-but-one.
SWEEP = (
    ("float32, 128 tokens, passes of 32",
     EncoderConfig(dtype="float32", max_seq_len=128, batch_size=32, num_threads=1)),
    ("float32, 64 tokens, passes of 8",
     EncoderConfig(dtype="float32", max_seq_len=64, batch_size=8, num_threads=1)),
    ("bfloat16, 128 tokens, passes of 32",
     EncoderConfig(dtype="bfloat16", max_seq_len=128, batch_size=32, num_threads=1)),
    ("bfloat16, 64 tokens, passes of 32",
     EncoderConfig(dtype="bfloat16", max_seq_len=64, batch_size=32, num_threads=1)),
    ("bfloat16, 64 tokens, passes of 8 (shipped)",
     EncoderConfig(dtype="bfloat16", max_seq_len=64, batch_size=8, num_threads=1)),
    ("bfloat16, 64 tokens, passes of 8, first 4 layers",
     EncoderConfig(dtype="bfloat16", max_seq_len=64, batch_size=8, num_threads=1,
                   num_layers=4, layers=(1, 2, 3, 4))),
)


def sweep(args: argparse.Namespace, console: Console) -> None:
    """Time the encoder alone under several settings, on the prompts `cost` uses."""
    prompts = load_benchmark_prompts(args.data)
    random.Random(0).shuffle(prompts)
    prompts = prompts[: args.num_prompts]
    table = Table(title=f"Encoder alone, one thread, {len(prompts)} real prompts, "
                        f"{args.batch_size} per call (best of 2)")
    table.add_column("encoder setting")
    table.add_column("ms per prompt", justify="right")
    for label, config in SWEEP:
        encoder = Encoder(config)
        encoder.embed(prompts[: args.batch_size])  # warm up kernels
        best = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            for start in range(0, len(prompts), args.batch_size):
                encoder.embed(prompts[start:start + args.batch_size])
            best = min(best, (time.perf_counter() - t0) * 1e3 / len(prompts))
        table.add_row(label, f"{best:.2f}")
        console.print(f"{label}: {best:.2f} ms per prompt")
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR,
                        help="shared data folder (default: ../shared/data beside the repo)")
    parser.add_argument("--rows", type=Path, nargs="*", default=None,
                        help="JSONL row files instead of building rows from --data")
    parser.add_argument("--split", choices=("cv", "holdout", "lomo"), default="cv",
                        help="lomo: each serving model held out in turn, its answers and the "
                             "prompts of the test fold unseen")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for the quality run")
    parser.add_argument("--markdown", action="store_true", help="also print markdown / JSON")
    parser.add_argument("--learning-curve", action="store_true",
                        help="also train the encoder model on 25/50/75/100%% of the prompts")
    parser.add_argument("--cost", action="store_true", help="time the shipped predictor instead")
    parser.add_argument("--sweep", action="store_true",
                        help="with --cost: time the encoder alone under several settings")
    parser.add_argument("--artifact", type=Path, default=None,
                        help="default: this CPU's shipped head")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="prompts per predict_batch call in --cost")
    parser.add_argument("--num-prompts", type=int, default=512)
    args = parser.parse_args(argv)
    args.artifact = args.artifact or bootstrap_artifact()
    console = Console(width=140)
    if args.cost:
        (sweep if args.sweep else cost)(args, console)
    else:
        quality(args, console)
    return 0
