"""What `blockq models length-train|length-predict|length-info` do, without the CLI around it.

Train and predict on JSONL files (`dataset.read_length_jsonl` says what a line holds), so that
anyone can train the length model on their own rows and score it on their own prompts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workers.predict.dataset import read_length_jsonl
from workers.predict.length_model import (
    AnyEncoder,
    LengthHead,
    LengthPredictor,
    TrainConfig,
    bootstrap_artifact,
    head_artifact,
    make_encoder,
    static_sibling,
    train,
)

__all__ = ["CachedEncoder", "PATH_USERS", "PREDICT_CAP", "PathHead", "artifact_summary",
           "measure_cost_ms", "path_heads", "predict_file", "train_file", "train_heads"]

#: Who uses each path's head (`stage.HEAD_FAST`, `stage.HEAD_ACCURATE`).
PATH_USERS = {
    "fast": "held completions routed in the API; interactive requests in the predict task "
            "(one prompt at a time)",
    "accurate": "batch lines (predict_bulk), batch completion estimates, retraining (batched)",
}
#: Prompts a cost is measured on: short questions to long pasted texts.
_COST_PROMPTS = tuple(
    f"{ask} " + "the queue holds work until a worker takes it. " * n
    for n, ask in enumerate(["Classify the sentiment of this review as positive or negative.",
                             "Write an essay about the history of tea, with sources.",
                             "Summarise the following in three bullet points.",
                             "Translate this into French.", "Explain this code, line by line.",
                             "What is the capital of Peru?", "Write a poem about queues.",
                             "Answer yes or no: is this spam?"] * 4))

#: Cap of a prediction when a TEST line gives no max_tokens (above any answer in the data).
PREDICT_CAP = 16_384
#: Rows predicted per pass (bounds the memory of the per-row inputs).
_CHUNK_ROWS = 20_000


class CachedEncoder:
    """An encoder that embeds each distinct text once (across calls), then reuses the row."""

    def __init__(self, encoder: AnyEncoder) -> None:
        self.inner = encoder
        self.name, self.dim = encoder.name, encoder.dim
        self.config, self.max_seq_len = encoder.config, encoder.max_seq_len
        self.kind = getattr(encoder, "kind", "transformer")
        self._rows: dict[str, np.ndarray] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if t not in self._rows))
        if missing:
            for text, row in zip(missing, self.inner.embed(missing), strict=True):
                self._rows[text] = row
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._rows[t] for t in texts])


def train_file(data: Path | str, out: Path | str, *, source_name: str | None = None,
               licence: str | None = None, encoder: AnyEncoder | None = None,
               config: TrainConfig | None = None) -> tuple[LengthHead, dict]:
    """Train on a TRAIN JSONL file and write the artifact; returns the head and its metrics."""
    rows = read_length_jsonl(data, need_tokens=True)
    source = {"name": source_name or Path(data).name,
              "licence": licence or "not stated (the rows' own terms apply)",
              "rows": sum(1 for r in rows if r["output_tokens"] >= 1)}
    predictor, metrics = train(rows, encoder=encoder, config=config or TrainConfig(),
                               sources=[source])
    predictor.head.save(out)
    return predictor.head, metrics


def train_heads(data: Path | str, out: Path | str, *, encoder: str = "both",
                source_name: str | None = None, licence: str | None = None,
                config: TrainConfig | None = None) -> list[tuple[Path, LengthHead, dict]]:
    """Train the heads `encoder` names on the same rows: "both" writes the accurate (MiniLM)
    head to `out` and the fast (static) one beside it (`static_sibling`), the pair serving
    finds together (`length_model.head_artifact`); "minilm", "static" or "auto" one head."""
    kinds = [("minilm", Path(out)), ("static", static_sibling(out))] if encoder == "both" \
        else [(encoder, Path(out))]
    written = []
    for kind, path in kinds:
        head, metrics = train_file(data, path, source_name=source_name, licence=licence,
                                   encoder=make_encoder(kind), config=config)
        written.append((path, head, metrics))
    return written


def predict_file(artifact: Path | str, data: Path | str) -> Iterator[dict]:
    """`{"predicted_tokens": n}` per TEST line, in order; a model absent from the artifact's
    training is predicted zero-shot (the population's model effect)."""
    rows = read_length_jsonl(data, need_tokens=False)
    predictor = LengthPredictor.load(artifact, num_threads=1)
    predictor = LengthPredictor(predictor.head, encoder=CachedEncoder(predictor.encoder),
                                counter=predictor.counter)
    for start in range(0, len(rows), _CHUNK_ROWS):
        chunk = rows[start:start + _CHUNK_ROWS]
        caps = [_cap(r) for r in chunk]
        predictions = predictor.predict_batch([r["prompt"] for r in chunk],
                                              [r["model"] for r in chunk], caps)
        for prediction in predictions:
            yield {"predicted_tokens": prediction.tokens}


def _cap(row: Mapping) -> int:
    value = row.get("max_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 \
        else PREDICT_CAP


def artifact_summary(path: Path | str | None = None) -> dict:
    """What `blockq models length-info` shows: version, encoder, sources and their licences
    (default: this CPU's shipped head)."""
    path = bootstrap_artifact() if path is None else path
    head = LengthHead.load(path)
    metrics = head.metrics
    return {"artifact": str(path), "version": head.version, "trained_at": head.trained_at,
            "encoder": head.encoder.get("name"), "serving_models": len(head.model_names),
            "sources": [dict(s) for s in head.sources],
            "out_of_fold_mae_tokens": metrics.get("mae_tokens"),
            "rows": metrics.get("num_rows"), "prompts": metrics.get("num_prompts"),
            "method": metrics.get("method", "ridge"),
            "prompt_insensitive_models": metrics.get("prompt_insensitive_models", "")}


@dataclass(frozen=True, slots=True)
class PathHead:
    """One path's head, as `blockq models length-info` shows it."""

    path: str                # "fast" or "accurate"
    used_by: str
    artifact: Path
    encoder: str
    cost_ms: float | None    # CPU a prompt, measured in this process as the path runs it


def path_heads(*, accurate: Path | None, fast: Path | None,
               measure: bool = True) -> list[PathHead]:
    """Each path's head as configured (`length_model.head_artifact`); with `measure`, its
    CPU cost a prompt on this machine: one prompt at a time for the fast path, batched for
    the accurate one, as each runs in service."""
    heads = []
    for path, batched in (("fast", False), ("accurate", True)):
        artifact = head_artifact(path, accurate=accurate, fast=fast)
        cost = None
        if measure:
            cost = measure_cost_ms(LengthPredictor.load(artifact, num_threads=1),
                                   batched=batched)
        heads.append(PathHead(path, PATH_USERS[path], artifact,
                              str(LengthHead.load(artifact).encoder.get("name")), cost))
    return heads


def measure_cost_ms(predictor: LengthPredictor, *, batched: bool,
                    prompts: Sequence[str] = _COST_PROMPTS) -> float:
    """Milliseconds of this process's CPU a prompt (after one warm-up call): all prompts in
    one call when `batched`, else one call each. A timing: it depends on the machine and its
    load."""
    predictor.predict_batch(list(prompts[:8]), "", 256)
    started = time.process_time()
    if batched:
        predictor.predict_batch(list(prompts), "", 256)
    else:
        for prompt in prompts:
            predictor.predict_batch([prompt], "", 256)
    return (time.process_time() - started) * 1e3 / len(prompts)
