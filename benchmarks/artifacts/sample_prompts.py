"""Derive the demo's sample prompts (app/demo/sample_prompts.jsonl) from real conversations.

Reads real user prompts together with real model answers from the shared data directory
(Arena-Hard v0.1, arena-bench-v1 and a ShareGPT sample, see ``SOURCES.md`` there) and writes
one JSON object per line::

    {"prompt": str, "max_tokens": int, "source": str}

``max_tokens`` comes from the length of the real answer (words / 4, clipped), so the demo's
output lengths vary the way real ones do, scaled down to fit a CPU. ``source`` is
``"<data set>/<answering model>"``. The output is deterministic for a given seed.

Usage::

    python scripts/make_sample_prompts.py [--data-dir DIR] [--out FILE] [--count N] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from benchmarks.paths import DATA_DIR, ROOT

#: ``../shared/data`` next to the repository checkout.
DEFAULT_DATA_DIR = DATA_DIR
DEFAULT_OUT = ROOT / "app" / "demo" / "sample_prompts.jsonl"

DEFAULT_COUNT = 300
DEFAULT_SEED = 20250811
MAX_PROMPT_CHARS = 1500
MIN_MAX_TOKENS = 16
MAX_MAX_TOKENS = 192
#: Answer words per generated token in the demo (a scale-down so a CPU engine keeps up).
WORDS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class Pair:
    """One real prompt with one real answer."""

    prompt: str
    answer: str
    source: str  # "<data set>/<answering model>"


def _read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_arena_hard(data_dir: Path) -> list[list[Pair]]:
    """Arena-Hard v0.1: one group per question, one pair per answering model."""
    base = data_dir / "conversations" / "arena-hard-auto" / "arena-hard-v0.1"
    prompts = {q["uid"]: q["prompt"] for q in _read_jsonl(base / "question.jsonl")}
    groups: dict[str, list[Pair]] = {}
    for answer_file in sorted((base / "model_answer").glob("*.jsonl")):
        for row in _read_jsonl(answer_file):
            uid = row["uid"]
            answers = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
            if uid not in prompts or not answers:
                continue
            content = answers[0]
            answer = content.get("answer", "") if isinstance(content, dict) else str(content)
            pair = Pair(prompts[uid], answer, f"arena-hard-v0.1/{row['model']}")
            groups.setdefault(uid, []).append(pair)
    return [groups[uid] for uid in sorted(groups)]


def load_arena_bench(data_dir: Path) -> list[list[Pair]]:
    """arena-bench-v1: answers joined to questions by ``question_id``."""
    base = data_dir / "conversations" / "arena-hard-auto" / "arena-bench-v1"
    prompts = {q["question_id"]: q["turns"][0] for q in _read_jsonl(base / "question.jsonl")}
    groups: dict[str, list[Pair]] = {}
    for answer_file in sorted((base / "model_answer").glob("*.jsonl")):
        for row in _read_jsonl(answer_file):
            qid = row["question_id"]
            if qid not in prompts or not row["choices"]:
                continue
            answer = row["choices"][0]["turns"][0]
            pair = Pair(prompts[qid], answer, f"arena-bench-v1/{row['model_id']}")
            groups.setdefault(qid, []).append(pair)
    return [groups[qid] for qid in sorted(groups)]


def load_sharegpt(data_dir: Path) -> list[list[Pair]]:
    """ShareGPT sample: first human turn and the ChatGPT response."""
    path = data_dir / "conversations" / "sharegpt" / "sharegpt_sample.json"
    rows = json.loads(path.read_text(encoding="utf-8"))
    return [
        [Pair(row["prompt"], row["response"], "sharegpt/chatgpt")]
        for row in sorted(rows, key=lambda r: r["conversation_id"])
    ]


def max_tokens_for(answer: str) -> int:
    """Output budget for the demo: answer words / WORDS_PER_TOKEN, clipped."""
    num_words = len(answer.split())
    return max(MIN_MAX_TOKENS, min(MAX_MAX_TOKENS, round(num_words / WORDS_PER_TOKEN)))


def build_samples(data_dir: Path, count: int, seed: int) -> list[dict]:
    """Pick ``count`` prompts (one answer each) at random with ``seed``; skip long prompts."""
    rng = random.Random(seed)
    candidates: list[Pair] = []
    for group in load_arena_hard(data_dir) + load_arena_bench(data_dir) + load_sharegpt(data_dir):
        pair = rng.choice(group)  # NOTE: one answer per prompt, so prompts do not repeat.
        if 0 < len(pair.prompt.strip()) <= MAX_PROMPT_CHARS and pair.answer.strip():
            candidates.append(pair)
    if len(candidates) < count:
        raise ValueError(f"only {len(candidates)} usable prompts in {data_dir}, asked for {count}")
    chosen = rng.sample(candidates, count)
    return [
        {"prompt": p.prompt, "max_tokens": max_tokens_for(p.answer), "source": p.source}
        for p in chosen
    ]


def write_jsonl(samples: list[dict], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for sample in samples:
            f.write(json.dumps(sample, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                        help="shared data directory (default: ../shared/data next to the repo)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output JSONL file")
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT, help="number of prompts")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="random seed")
    args = parser.parse_args(argv)

    if not args.data_dir.is_dir():
        parser.error(f"data directory not found: {args.data_dir}")
    samples = build_samples(args.data_dir, args.count, args.seed)
    write_jsonl(samples, args.out)

    by_source = Counter(s["source"] for s in samples)
    max_tokens = sorted(s["max_tokens"] for s in samples)
    print(f"wrote {len(samples)} prompts to {args.out}")
    print(f"{'source':<52} {'prompts':>7}")
    for source, n in sorted(by_source.items()):
        print(f"{source:<52} {n:>7}")
    print(f"max_tokens min/p50/p90/max: {max_tokens[0]}/{max_tokens[len(max_tokens) // 2]}/"
          f"{max_tokens[int(len(max_tokens) * 0.9)]}/{max_tokens[-1]}")
    return 0
