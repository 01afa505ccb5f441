"""Bootstrap training rows for the length model: real prompts with real answers, split by prompt.

Sources under ``<data>/conversations`` (see ``SOURCES.md`` in the data folder):

- ``arena-hard-auto/arena-hard-v0.1``: 500 prompts, answers of gpt-4-0314, gpt-4-0613 and
  gpt-3.5-turbo-0125 (``messages[1].content.answer``);
- ``arena-hard-auto/arena-bench-v1``: 300 prompts, answers of vicuna-7b-v1.5,
  Mistral-7B-Instruct-v0.1 and gpt-3.5-turbo (the first answer turn, ``choices[0].turns[0]``;
  a few gpt-3.5-turbo records carry answers to follow-ups that the question file lacks);
- ``sharegpt/sharegpt_sample.json``: 50 ShareGPT first turns with ChatGPT's answer, recorded
  as model ``chatgpt-sharegpt``.

NOTE: ``sharegpt/ShareGPT_V3_filtered_1000.json`` holds the first *human* turn only (no answers),
so it gives no training rows; `load_prompts_only` reads it for latency benchmarks.

Answer lengths are counted in Qwen tokens (`features.TokenCounter`), the vocabulary of the
Qwen2 models the platform serves; for other serving models they are a consistent proxy.
A row's ``prompt_id`` is a hash of the prompt text, so a prompt that appears in two sources is
one group, and the split by prompt keeps every answer to a prompt on one side.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from workers.predict.features import TokenCounter

__all__ = [
    "ALPACA_EVAL_LICENCE",
    "InputError",
    "LengthRow",
    "build_rows",
    "read_length_jsonl",
    "read_many_models",
    "load_benchmark_prompts",
    "load_prompts_only",
    "prompt_id_of",
    "read_rows",
    "split_by_prompt",
    "write_rows",
]

#: ``../shared/data`` beside the repository checkout; every command takes ``--data`` instead.
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"

ARENA_HARD = Path("conversations/arena-hard-auto/arena-hard-v0.1")
ARENA_BENCH = Path("conversations/arena-hard-auto/arena-bench-v1")
SHAREGPT_PAIRS = Path("conversations/sharegpt/sharegpt_sample.json")
SHAREGPT_PROMPTS = Path("conversations/sharegpt/ShareGPT_V3_filtered_1000.json")
SHAREGPT_MODEL = "chatgpt-sharegpt"


@dataclass(frozen=True, slots=True)
class LengthRow:
    """One observed answer: the unit the length model trains and is evaluated on."""

    prompt_id: str       # groups every answer to the same prompt text (the split key)
    prompt: str          # the user prompt (single turn)
    model: str           # the model that answered
    output_tokens: int   # answer length in Qwen tokens
    source: str = ""     # where the row came from (dataset name, or "history")

    @classmethod
    def from_dict(cls, raw: dict) -> LengthRow:
        prompt = str(raw["prompt"])
        return cls(
            prompt_id=str(raw.get("prompt_id") or prompt_id_of(prompt)),
            prompt=prompt,
            model=str(raw["model"]),
            output_tokens=int(raw["output_tokens"]),
            source=str(raw.get("source", "")),
        )


def prompt_id_of(prompt: str) -> str:
    """A stable id for a prompt text (whitespace-normalised)."""
    return hashlib.sha1(" ".join(prompt.split()).encode()).hexdigest()[:16]


def _read_jsonl(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def _arena_hard(data_dir: Path) -> Iterator[tuple[str, str, str, str]]:
    root = data_dir / ARENA_HARD
    prompts = {q["uid"]: q["prompt"] for q in _read_jsonl(root / "question.jsonl")}
    for path in sorted((root / "model_answer").glob("*.jsonl")):
        for answer in _read_jsonl(path):
            if answer["uid"] not in prompts:
                continue
            content = answer["messages"][1]["content"]
            text = content["answer"] if isinstance(content, dict) else str(content)
            yield prompts[answer["uid"]], answer["model"], text, "arena-hard-v0.1"


def _arena_bench(data_dir: Path) -> Iterator[tuple[str, str, str, str]]:
    root = data_dir / ARENA_BENCH
    prompts = {q["question_id"]: q["turns"][0] for q in _read_jsonl(root / "question.jsonl")}
    for path in sorted((root / "model_answer").glob("*.jsonl")):
        for answer in _read_jsonl(path):
            if answer["question_id"] not in prompts:
                continue
            text = answer["choices"][0]["turns"][0]
            yield prompts[answer["question_id"]], answer["model_id"], text, "arena-bench-v1"


def _sharegpt(data_dir: Path) -> Iterator[tuple[str, str, str, str]]:
    path = data_dir / SHAREGPT_PAIRS
    for record in json.loads(path.read_text(encoding="utf-8")):
        turns = record["conversations"]
        if len(turns) >= 2 and turns[0]["from"] == "human" and turns[1]["from"] == "gpt":
            yield turns[0]["value"], SHAREGPT_MODEL, turns[1]["value"], "sharegpt_sample"


def build_rows(data_dir: Path = DEFAULT_DATA_DIR,
               counter: TokenCounter | None = None) -> list[LengthRow]:
    """Every (prompt, model, answer tokens) pair found under `data_dir`.

    Empty prompts and empty answers are skipped (no signal, and log(0) is undefined).
    """
    counter = counter or TokenCounter()
    rows = []
    for source in (_arena_hard, _arena_bench, _sharegpt):
        for prompt, model, answer, name in source(Path(data_dir)):
            if not prompt.strip() or not answer.strip():
                continue
            rows.append(LengthRow(prompt_id_of(prompt), prompt, model, counter(answer), name))
    return rows


def load_prompts_only(data_dir: Path = DEFAULT_DATA_DIR) -> list[str]:
    """The 1,000 ShareGPT first human turns (no answers): realistic inputs for cost benchmarks."""
    records = json.loads((Path(data_dir) / SHAREGPT_PROMPTS).read_text(encoding="utf-8"))
    return [r["conversations"][0]["value"] for r in records if r["conversations"]]


def load_benchmark_prompts(data_dir: Path = DEFAULT_DATA_DIR) -> list[str]:
    """Every distinct prompt text at hand, answers not read: Arena-Hard, arena-bench, ShareGPT."""
    data_dir = Path(data_dir)
    prompts = [q["prompt"] for q in _read_jsonl(data_dir / ARENA_HARD / "question.jsonl")]
    prompts += [q["turns"][0] for q in _read_jsonl(data_dir / ARENA_BENCH / "question.jsonl")]
    prompts += load_prompts_only(data_dir)
    return sorted({p for p in prompts if p.strip()})


def split_by_prompt(rows: Sequence[LengthRow], *, test_share: float = 0.2,
                    seed: int = 0) -> tuple[list[LengthRow], list[LengthRow]]:
    """(train, test): every prompt lands wholly on one side, chosen by a seeded hash of its id."""
    if not 0.0 < test_share < 1.0:
        raise ValueError(f"test_share must be in (0, 1), got {test_share}")
    train, test = [], []
    for row in rows:
        digest = hashlib.sha1(f"{seed}:{row.prompt_id}".encode()).digest()
        bucket = int.from_bytes(digest[:8], "big") / 2**64
        (test if bucket < test_share else train).append(row)
    return train, test


#: The licence of the AlpacaEval model outputs (``lengths/README.md`` in the data folder).
ALPACA_EVAL_LICENCE = "CC BY-NC 4.0"
#: Where ``lengths/alpaca_eval_many_models.jsonl`` comes from.
ALPACA_EVAL_SOURCE = ("AlpacaEval model outputs (github.com/tatsu-lab/alpaca_eval, "
                      "results/<model>/model_outputs.json), lengths in Qwen tokens")
MANY_MODELS = Path("lengths/alpaca_eval_many_models.jsonl")


def read_many_models(path: Path) -> list[LengthRow]:
    """One row per (prompt, model) answer of ``alpaca_eval_many_models.jsonl`` (one line per
    prompt with its answers' lengths by model); the prompt id is the file's."""
    rows = []
    for record in _read_jsonl(Path(path)):
        for model, tokens in record["answers"].items():
            rows.append(LengthRow(str(record["prompt_id"]), str(record["prompt"]), str(model),
                                  int(tokens), "alpaca_eval"))
    return rows


class InputError(ValueError):
    """A bad input file or line; the message names the file and, for a line, its number."""


def _check_prompt(prompt: object) -> str | None:
    """Why `prompt` is not a text or a list of chat messages, or None."""
    if isinstance(prompt, str):
        return None if prompt.strip() else "prompt is empty"
    if not isinstance(prompt, list) or not prompt:
        return "prompt must be a text or a non-empty list of chat messages"
    for message in prompt:
        if not isinstance(message, dict) or not isinstance(message.get("content"), str | list):
            return "each chat message must be an object with a content"
        if not isinstance(message.get("role", "user"), str):
            return "a chat message's role must be a text"
    return None


def read_length_jsonl(path: Path | str, *, need_tokens: bool) -> list[dict]:
    """Rows of a length-model JSONL file: {"prompt", "model"[, "output_tokens"]} per line.

    `prompt` is a text or chat messages, `model` the serving model's name, `output_tokens` (when
    `need_tokens`) an integer >= 0. Blank lines are skipped. Raises `InputError` naming the
    file and the line for a missing file, a line that is not JSON, or a missing or bad field.
    """
    path = Path(path)
    try:
        handle = open(path, encoding="utf-8")
    except OSError as error:
        raise InputError(f"{path}: cannot read ({error.strerror or error})") from None
    rows: list[dict] = []
    with handle:
        try:
            lines = list(handle)
        except UnicodeDecodeError:
            raise InputError(f"{path}: not UTF-8 text") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as error:
            raise InputError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        if not isinstance(raw, dict):
            raise InputError(f"{path}:{number}: a line must be a JSON object")
        for key in ("prompt", "model", *(("output_tokens",) if need_tokens else ())):
            if key not in raw:
                raise InputError(f"{path}:{number}: missing field {key!r}")
        problem = _check_prompt(raw["prompt"])
        if problem:
            raise InputError(f"{path}:{number}: {problem}")
        if not isinstance(raw["model"], str) or not raw["model"].strip():
            raise InputError(f"{path}:{number}: model must be a non-empty text")
        row = {"prompt": raw["prompt"], "model": raw["model"]}
        if need_tokens:
            tokens = raw["output_tokens"]
            if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
                raise InputError(f"{path}:{number}: output_tokens must be an integer >= 0, "
                                 f"got {tokens!r}")
            row["output_tokens"] = tokens
        rows.append(row)
    if not rows:
        raise InputError(f"{path}: no rows")
    return rows


def read_rows(path: Path) -> list[LengthRow]:
    """Rows from JSONL with keys prompt, model, output_tokens (prompt_id and source optional)."""
    return [LengthRow.from_dict(raw) for raw in _read_jsonl(Path(path))]


def write_rows(path: Path, rows: Iterable[LengthRow]) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(asdict(row), ensure_ascii=False) + "\n")
            count += 1
    return count
