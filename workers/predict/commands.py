"""What `blockq models length-train|length-predict|length-info` do, without the CLI around it.

Train and predict on JSONL files (`dataset.read_length_jsonl` says what a line holds), so that
anyone can train the length model on their own rows and score it on their own prompts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from workers.predict.dataset import read_length_jsonl
from workers.predict.length_model import (
    AnyEncoder,
    LengthHead,
    LengthPredictor,
    TrainConfig,
    bootstrap_artifact,
    train,
)

__all__ = ["CachedEncoder", "PREDICT_CAP", "artifact_summary", "predict_file", "train_file"]

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
