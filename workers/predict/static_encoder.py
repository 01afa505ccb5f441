"""A cheap prompt encoder: static token embeddings distilled from the shipped MiniLM encoder.

Each token of MiniLM's WordPiece vocabulary is embedded once through the full model (as the
one-token text ``[CLS] token [SEP]``, every layer mean-pooled as `encoder.Encoder` pools a
prompt), the vocabulary's embeddings are reduced by PCA and stored as an int8 matrix. A prompt
is then the unit-length mean of its tokens' rows: a tokenizer call and a gather, no network, no
torch (model2vec's recipe). It loses the context a transformer mixes in, and costs about a
hundredth of it (docs/benchmarks_length.md has the table of error against CPU time).

The artifact (``models/static_minilm.npz``) holds the matrix (int8, one scale per column) and
the tokenizer's JSON, so loading it needs only numpy and the ``tokenizers`` package. `distill`
builds it (torch and transformers are imported there only).
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["STATIC_ARTIFACT", "STATIC_ENCODER", "StaticEncoder", "distill"]

#: Name recorded in length-model artifacts trained on the static encoder.
STATIC_ENCODER = "static-minilm-l6"
#: The distilled matrix shipped with the package (built by scripts/distill_static_encoder.py).
STATIC_ARTIFACT = Path(__file__).resolve().parent / "models" / "static_minilm.npz"


@dataclass(frozen=True, slots=True)
class StaticEncoderConfig:
    """What a head trained on the static encoder records (the same knobs as `EncoderConfig`)."""

    #: Tokens per prompt after truncation (head and tail kept), as MiniLM's `max_seq_len`.
    max_seq_len: int = 256
    #: Share of `max_seq_len` kept from the end of a long prompt.
    tail_share: float = 0.5


class StaticEncoder:
    """Embeds texts as the unit-length mean of their tokens' distilled rows, shape (n, dim)."""

    #: What `length_model.encoder_info` records ("transformer" for `encoder.Encoder`).
    kind = "static"

    def __init__(self, matrix: np.ndarray, tokenizer_json: str, *, name: str = STATIC_ENCODER,
                 config: StaticEncoderConfig = StaticEncoderConfig(),
                 source: dict | None = None) -> None:
        from tokenizers import Tokenizer  # NOTE: Rust tokenizer, no torch

        if matrix.ndim != 2 or not len(matrix):
            raise ValueError("the static embedding matrix must be (vocabulary, dim)")
        self.matrix = np.asarray(matrix, dtype=np.float32)
        self.tokenizer = Tokenizer.from_str(tokenizer_json)
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self._tokenizer_json = tokenizer_json
        self.name = name
        self.config = config
        self.dim = int(matrix.shape[1])
        self.max_seq_len = config.max_seq_len
        self.source = dict(source or {})

    @classmethod
    def load(cls, path: Path | str = STATIC_ARTIFACT, *,
             config: StaticEncoderConfig = StaticEncoderConfig()) -> StaticEncoder:
        with np.load(Path(path), allow_pickle=False) as arrays:
            meta = json.loads(arrays["meta"].tobytes().decode())
            matrix = arrays["matrix"].astype(np.float32) * arrays["scale"].astype(np.float32)
            return cls(matrix, arrays["tokenizer"].tobytes().decode(),
                       name=str(meta["name"]), config=config, source=meta)

    def save(self, path: Path | str) -> Path:
        """Write the matrix as int8 with one scale per column (a quarter of float32)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        scale = (np.abs(self.matrix).max(axis=0) / 127.0).astype(np.float32)
        scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
        quantized = np.clip(np.rint(self.matrix / scale), -127, 127).astype(np.int8)
        buffer = io.BytesIO()
        np.savez_compressed(
            buffer, meta=np.frombuffer(json.dumps({**self.source, "name": self.name}).encode(),
                                       dtype=np.uint8),
            matrix=quantized, scale=scale,
            tokenizer=np.frombuffer(self._tokenizer_json.encode(), dtype=np.uint8))
        path.write_bytes(buffer.getvalue())
        return path

    def _truncate(self, ids: list[int]) -> list[int]:
        if len(ids) <= self.max_seq_len:
            return ids
        num_tail = int(self.max_seq_len * self.config.tail_share)
        return ids[: self.max_seq_len - num_tail] + (ids[-num_tail:] if num_tail else [])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-length embeddings, shape (len(texts), dim), float32, in input order.

        An empty text (no token) embeds as zeros.
        """
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        for row, encoding in enumerate(encodings):
            ids = self._truncate(encoding.ids)
            if ids:
                out[row] = self.matrix[ids].mean(axis=0)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)


def distill(encoder_path: str | None = None, *, dim: int = 128,
            layers: Sequence[int] = (-6, -5, -4, -3, -2, -1), batch_size: int = 512,
            num_threads: int | None = 1) -> StaticEncoder:
    """Distil the static encoder from a local Hugging Face encoder (default: packaged MiniLM).

    Every vocabulary token is embedded through the model as ``[CLS] token [SEP]``; the hidden
    states in `layers` are mean-pooled over those positions, normalised per layer and
    concatenated (what `encoder.Encoder` does to a prompt); the vocabulary's vectors are then
    centred and reduced to their `dim` principal components.
    """
    import torch

    from workers.predict.encoder import DEFAULT_ENCODER, Encoder, EncoderConfig

    encoder = Encoder(EncoderConfig(path=encoder_path, layers=tuple(layers), dtype="float32",
                                    num_threads=num_threads))
    tokenizer_json = encoder.tokenizer.backend_tokenizer.to_str()
    vocab = encoder.tokenizer.get_vocab()
    size = max(vocab.values()) + 1
    prefix, suffix = encoder._prefix_ids, encoder._suffix_ids
    vectors = np.zeros((size, encoder.dim), dtype=np.float32)
    with torch.inference_mode():
        for start in range(0, size, batch_size):
            ids = torch.tensor([prefix + [i] + suffix
                                for i in range(start, min(size, start + batch_size))])
            states = encoder.model(input_ids=ids, attention_mask=torch.ones_like(ids),
                                   output_hidden_states=True).hidden_states
            pooled = [torch.nn.functional.normalize(states[layer].float().mean(1), dim=-1)
                      for layer in layers]
            vectors[start:start + len(ids)] = torch.cat(pooled, dim=-1).numpy()
    centered = vectors - vectors.mean(0)
    # NOTE: PCA by the eigenvectors of the (dim x dim) covariance: cheap for 30k x 2,304.
    eigvals, eigvecs = np.linalg.eigh(centered.T @ centered)
    top = eigvecs[:, np.argsort(eigvals)[::-1][:dim]]
    matrix = centered @ top
    explained = float(np.sort(eigvals)[::-1][:dim].sum() / eigvals.sum())
    name = STATIC_ENCODER if encoder.name == DEFAULT_ENCODER else f"static-{encoder.name}"
    return StaticEncoder(matrix.astype(np.float32), tokenizer_json, name=name,
                         source={"distilled_from": encoder.name, "layers": list(layers),
                                 "pca_dim": dim, "pca_explained": round(explained, 4),
                                 "vocabulary": size})
