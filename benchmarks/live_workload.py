"""Build the "conversations" replay workload: held-out real prompts, real answer lengths, and the
predictions of a length model that never saw them.

Steps:

1. rows from ../shared/data/conversations (`workers.predict.dataset.build_rows`), split by prompt
   with `dataset.split_by_prompt` (seeded; every answer to a prompt on one side);
2. a length model trained on the training prompts only, with the shipped bootstrap model's recipe
   (`length_model.train`, default `TrainConfig`, the packaged encoder, as
   ``scripts/train_length_model.py`` does), saved as ``<out>/model/length.npz``: point
   ``Settings.length_model_path`` (BLOCKQ_LENGTH_MODEL_PATH) at that file;
3. ``<out>/requests.jsonl``: one row per held-out (replay) prompt, read back by
   `workers.cluster_sim.workload.load_replay_prompts`::

       {"prompt", "source_model", "output_tokens", "prompt_tokens", "predicted_tokens"}

   - source_model: ONE answer per prompt (the emulated engine's `AnswerLengths` keys on the
     prompt text, so it cannot tell two answers to one prompt apart), drawn uniformly among the
     prompt's answers by a seeded hash of (seed, prompt id): the replay keeps the training data's
     mix of answering models;
   - output_tokens: that answer's length in Qwen tokens, capped at max_model_len - prompt_tokens
     (where an engine stops it); prompts of max_model_len tokens or more are left out;
   - prompt_tokens: counted with the served model's tokenizer (`domain.prompts.PromptCodec`), as
     the emulated fleet counts a text prompt (the live and simulated benchmarks agree);
   - predicted_tokens: the saved model, loaded as a predictor worker loads it
     (`LengthPredictor.load`), for the prompt text and the serving model name
     (``--serving-model``, default Settings.model_name), capped at the output room.
     NOTE: the predict worker asks for ``Settings.model_name`` (not the ``emulated/<name>`` that
     an emulated instance reports in its snapshots). A name the head has no intercept for (any
     name but the answering models of the training data, e.g. "tiny-llama") gets the pooled
     intercept, the row-weighted mean over the answering models: the right expectation for
     answers drawn across those models. ``manifest.json`` records whether the name is known;

4. ``<out>/manifest.json``: seed, split, counts, serving model, the held-out metrics.

It prints the held-out MAE and median relative error of predicted_tokens against output_tokens.

Usage::

    python scripts/make_live_workload.py [--out .blockq/live_workload] [--seed 0]
        [--test-share 0.2] [--serving-model NAME] [--max-model-len 4096] [--data DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from rich.console import Console

from domain.prompts import PromptCodec
from domain.settings import Settings
from workers.cluster_sim.workload import ReplayPrompt, load_replay_prompts
from workers.predict.dataset import DEFAULT_DATA_DIR, LengthRow, build_rows, split_by_prompt
from workers.predict.encoder import Encoder, EncoderConfig
from workers.predict.length_model import LengthPredictor, TrainConfig, length_metrics, train

DEFAULT_OUT = Path(".blockq/live_workload")
MODEL_FILE = Path("model/length.npz")


def choose_answers(rows: list[LengthRow], seed: int) -> list[LengthRow]:
    """One answer per prompt, uniform among its answers by a seeded hash; prompts in id order."""
    by_prompt: dict[str, list[LengthRow]] = defaultdict(list)
    for row in rows:
        by_prompt[row.prompt_id].append(row)
    chosen = []
    for prompt_id in sorted(by_prompt):
        answers = sorted(by_prompt[prompt_id], key=lambda r: (r.model, r.output_tokens))
        digest = hashlib.sha1(f"{seed}:answer:{prompt_id}".encode()).digest()
        chosen.append(answers[int.from_bytes(digest[:8], "big") % len(answers)])
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=0, help="seeds the split and answer choice")
    parser.add_argument("--test-share", type=float, default=0.2,
                        help="share of prompts held out for replay")
    parser.add_argument("--serving-model", default=Settings.model_fields["model_name"].default,
                        help="serving model name the predictor is asked for (Settings.model_name"
                        " of the live stack)")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    args = parser.parse_args(argv)
    console = Console(width=100)

    rows = build_rows(args.data)
    train_rows, test_rows = split_by_prompt(rows, test_share=args.test_share, seed=args.seed)
    console.print(f"{len(rows)} rows: train {len(train_rows)} rows "
                  f"({len({r.prompt_id for r in train_rows})} prompts), replay "
                  f"{len({r.prompt_id for r in test_rows})} prompts")

    started = time.perf_counter()
    encoder = Encoder(EncoderConfig(num_threads=args.threads))
    predictor, cv_metrics = train(train_rows, encoder=encoder, config=TrainConfig())
    model_path = predictor.head.save(args.out / MODEL_FILE)
    console.print(f"trained {predictor.name} on the training prompts in "
                  f"{time.perf_counter() - started:.0f} s -> {model_path}")

    # Predict as a predictor worker would: the saved artifact, loaded the worker's way.
    served = LengthPredictor.load(model_path, num_threads=args.threads)
    # Prompt tokens as the emulated fleet counts them: with the served model's tokenizer.
    codec = PromptCodec(Settings.load().resolved_model_path)
    counted = [(a, codec.count(a.prompt)) for a in choose_answers(test_rows, args.seed)]
    answers = [a for a, n in counted if n < args.max_model_len]
    prompt_tokens = [n for _, n in counted if n < args.max_model_len]
    room = [args.max_model_len - n for n in prompt_tokens]
    predictions = served.predict_batch([a.prompt for a in answers], args.serving_model, room)
    replay = [
        ReplayPrompt(prompt=a.prompt, source_model=a.model,
                     output_tokens=min(a.output_tokens, r), prompt_tokens=n,
                     predicted_tokens=p.tokens)
        for a, n, r, p in zip(answers, prompt_tokens, room, predictions, strict=True)
    ]
    requests_path = args.out / "requests.jsonl"
    with open(requests_path, "w", encoding="utf-8") as handle:
        for row in replay:
            handle.write(json.dumps(row.to_dict(), ensure_ascii=False) + "\n")
    assert load_replay_prompts(requests_path) == replay  # the loader reads back what we wrote

    held_out = length_metrics(np.array([r.predicted_tokens for r in replay]),
                              np.array([r.output_tokens for r in replay]))
    known = args.serving_model in served.head.model_names
    manifest = {
        "seed": args.seed, "test_share": args.test_share, "max_model_len": args.max_model_len,
        "num_rows": len(rows), "num_train_rows": len(train_rows),
        "num_train_prompts": len({r.prompt_id for r in train_rows}),
        "num_replay_prompts": len(replay),
        "source_models": dict(sorted(_count(r.source_model for r in replay).items())),
        "serving_model": args.serving_model, "serving_model_known": known,
        "model_path": str(MODEL_FILE), "model_version": served.head.version,
        "train_cv_metrics": {k: v for k, v in cv_metrics.items()},
        "held_out_metrics": held_out,
        "mean_output_tokens": float(np.mean([r.output_tokens for r in replay])),
        "mean_prompt_tokens": float(np.mean([r.prompt_tokens for r in replay])),
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2, default=float) + "\n")
    console.print(f"wrote {len(replay)} replay prompts to {requests_path}; serving model "
                  f"{args.serving_model!r} ({'own' if known else 'pooled'} intercept)")
    console.print(f"held-out predicted_tokens vs output_tokens: MAE {held_out['mae_tokens']:.1f} "
                  f"tokens, median relative error {held_out['median_rel_error']:.3f}, within "
                  f"25% {held_out['within_25pct']:.1%}, Spearman {held_out['spearman']:.3f}; "
                  f"training-side CV MAE {cv_metrics['mae_tokens']:.1f}")
    return 0


def _count(values) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for value in values:
        counts[value] += 1
    return counts
