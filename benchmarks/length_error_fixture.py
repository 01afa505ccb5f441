"""Measure the learned length model's held-out errors and save them as the cluster benchmark's
``learned-errors`` fixture (``workers/cluster_sim/data/learned_length_errors.json``).

The errors are the out-of-fold log residuals ``log(predicted) - log(true)`` of the shipped
model's recipe (MiniLM encoder + features, `length_model.fit_head` with the default
`TrainConfig`), from the cross-validation of ``scripts/eval_length_model.py`` (5 folds by prompt,
seed 0; every answer predicted by a head that never saw its prompt, capped to [1, 4096] tokens as
the predictor caps). The rows are ../shared/data/conversations (`dataset.build_rows`): the data the
shipped artifact was trained on.

The model's errors depend on the true length (it regresses to the mean: short answers are
over-predicted, long ones under-predicted), so the fixture keeps them per bin of true length
(equal-count bins); `workers.cluster_sim.predictors.LearnedErrorsPredictor` draws a residual from
the bin of each request's true length. The file records the commit of the shipped artifact, its
version and this script's command.

``--from-replay FILE`` is a cheap stand-in (no encoder run): the errors of the held-out model of a
replay workload (``scripts/make_live_workload.py``: the same recipe trained on 80 % of the prompts,
predicting the other 20 % for a serving model it does not know, i.e. with the pooled intercept, as
the live predictor does), far fewer answers (one per held-out prompt).

Usage::

    python scripts/make_length_error_fixture.py [--data DIR] [--bins 10] [--out FILE]
    python scripts/make_length_error_fixture.py --from-replay .blockq/live_workload/requests.jsonl \
        --bins 5
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import numpy as np

from benchmarks import length_eval as eval_length_model  # its folds and method
from benchmarks.paths import ROOT
from workers.cluster_sim.predictors import LEARNED_ERRORS_FIXTURE
from workers.cluster_sim.workload import load_replay_prompts
from workers.predict.dataset import DEFAULT_DATA_DIR, build_rows
from workers.predict.encoder import Encoder, EncoderConfig
from workers.predict.features import TokenCounter
from workers.predict.length_model import (
    BOOTSTRAP_ARTIFACT,
    LengthHead,
    design_matrix,
    encoder_info,
    length_metrics,
)


def out_of_fold(data_dir: Path, num_folds: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(predicted, true) tokens of every answer, out of fold; and the number of prompts."""
    rows = [r for r in build_rows(data_dir) if r.output_tokens >= 1]
    encoder = Encoder(EncoderConfig())
    design = design_matrix([r.prompt for r in rows], [r.model for r in rows],
                           encoder=encoder, counter=TokenCounter())
    tokens = np.array([r.output_tokens for r in rows], dtype=np.float64)
    groups = np.array([r.prompt_id for r in rows])
    method, _ = eval_length_model.encoder_method(design, tokens, groups, encoder_info(encoder))
    folds = eval_length_model.folds_of(rows, "cv", num_folds)
    test_index = np.concatenate([test for _, test in folds])
    predicted = np.concatenate([method(train, test) for train, test in folds])
    predicted = np.clip(np.rint(predicted), 1, eval_length_model.MAX_TOKENS)
    return predicted, tokens[test_index], len(set(groups))


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=False).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--bins", type=int, default=10, help="equal-count bins of true length")
    parser.add_argument("--out", type=Path, default=LEARNED_ERRORS_FIXTURE)
    parser.add_argument("--from-replay", type=Path, default=None, metavar="REQUESTS_JSONL",
                        help="take the errors of a replay workload's held-out model instead")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    if args.from_replay:
        replay = load_replay_prompts(args.from_replay)
        predicted = np.array([r.predicted_tokens for r in replay], dtype=np.float64)
        true = np.array([r.output_tokens for r in replay], dtype=np.float64)
        num_prompts = len(replay)
    else:
        predicted, true, num_prompts = out_of_fold(args.data, args.folds)
    residuals = np.log(predicted) - np.log(true)
    order = np.argsort(true, kind="stable")
    bins = []
    for part in np.array_split(order, args.bins):
        bins.append({
            "min_true_tokens": int(true[part].min()),
            "max_true_tokens": int(true[part].max()),
            "log_residuals": sorted(round(float(r), 4) for r in residuals[part]),
        })
    metrics = length_metrics(predicted, true)
    head = LengthHead.load(BOOTSTRAP_ARTIFACT)
    artifact = BOOTSTRAP_ARTIFACT.relative_to(ROOT)
    if args.from_replay:
        manifest_path = args.from_replay.parent / "manifest.json"
        manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
        held_out = {
            "description": "Held-out log residuals log(predicted) - log(true) of a replay "
            "workload's length model (the shipped recipe trained on the training prompts of "
            "scripts/make_live_workload.py's split, pooled intercept), one answer per held-out "
            "prompt, binned by true length (equal-count bins). Derived from "
            "../shared/data/conversations. A stand-in for the full out-of-fold fixture "
            "(this script without --from-replay).",
            "made_by": "python scripts/make_live_workload.py --seed "
            f"{manifest.get('seed', '?')} --test-share {manifest.get('test_share', '?')} && "
            "python scripts/make_length_error_fixture.py --from-replay "
            f"<out>/requests.jsonl --bins {args.bins}",
            "model_version": manifest.get("model_version"),
            "serving_model": manifest.get("serving_model"),
            "cross_validation": "one split by prompt (dataset.split_by_prompt)",
            "model_artifact": "<out>/model/length.npz of make_live_workload (the recipe of "
            f"{artifact}, trained on the training prompts)",
            "recipe_commit": _git("rev-parse", "HEAD"),
        }
    else:
        held_out = {
            "description": "Out-of-fold log residuals log(predicted) - log(true) of the "
            "learned length model (the shipped bootstrap recipe), binned by true length "
            "(equal-count bins). Derived from ../shared/data/conversations.",
            "made_by": "python scripts/make_length_error_fixture.py "
            f"--folds {args.folds} --bins {args.bins}",
            "model_version": head.version,
            "cross_validation": f"{args.folds}-fold by prompt, seed 0 "
            "(benchmarks.length_eval folds_of and encoder_method, scripts/eval_length_model.py)",
            "model_artifact": str(artifact),
            "model_commit": _git("log", "-1", "--format=%H", "--", str(artifact)),
        }
    fixture = {
        **held_out,
        "num_answers": int(len(true)),
        "num_prompts": num_prompts,
        "metrics": {k: round(v, 4) for k, v in metrics.items()},
        "residual_median": round(float(np.median(residuals)), 4),
        "residual_std": round(float(residuals.std()), 4),
        "bins": bins,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"{len(true)} answers to {num_prompts} prompts in {time.perf_counter() - started:.0f} s;"
          f" out-of-fold MAE {metrics['mae_tokens']:.1f} tokens, median rel. error "
          f"{metrics['median_rel_error']:.3f}, Spearman {metrics['spearman']:.3f}; residual "
          f"median {np.median(residuals):+.3f}, std {residuals.std():.3f} -> {args.out}")
    return 0
