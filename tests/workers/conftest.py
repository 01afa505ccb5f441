"""Fixtures of the length-predictor and learning tests: a tiny random encoder, a token counter."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from workers.predict.features import TokenCounter

if TYPE_CHECKING:
    from workers.predict.encoder import Encoder

# NOTE: torch, transformers and the encoder module are imported inside the fixtures: importing
# them takes seconds, and most tests under tests/workers (simulator, routing, serving) use neither.


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, 32-wide random BERT with MiniLM's tokenizer, saved like any local encoder."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from workers.predict.encoder import default_encoder_path

    path = tmp_path_factory.mktemp("tiny-bert")
    tokenizer = AutoTokenizer.from_pretrained(default_encoder_path())
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=128)
    BertModel(config).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_encoder(tiny_encoder_dir: Path) -> Encoder:
    from workers.predict.encoder import Encoder, EncoderConfig

    return Encoder(EncoderConfig(path=str(tiny_encoder_dir), dtype="float32", max_seq_len=64,
                                 layers=(-2, -1), batch_size=8))


@pytest.fixture(scope="session")
def counter() -> TokenCounter:
    return TokenCounter()
