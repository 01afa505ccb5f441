"""Fixtures for the length-predictor tests: a tiny random encoder and synthetic rows."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from workers.predict.dataset import LengthRow, prompt_id_of
from workers.predict.encoder import Encoder, EncoderConfig, default_encoder_path
from workers.predict.features import TokenCounter

TOPICS = ("tea", "rivers", "the moon", "compilers", "bees", "jazz", "glaciers", "chess",
          "bridges", "volcanoes", "owls", "printing", "salt", "trains", "maps", "clocks")
#: Serving models of the fixture and how verbose each is.
VERBOSITY = {"small-model": 0.6, "big-model": 1.5}


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, 32-wide random BERT with MiniLM's tokenizer, saved like any local encoder."""
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
    return Encoder(EncoderConfig(path=str(tiny_encoder_dir), dtype="float32", max_seq_len=64,
                                 layers=(-2, -1), batch_size=8))


@pytest.fixture(scope="session")
def counter() -> TokenCounter:
    return TokenCounter()


def synthetic_rows(num_prompts: int = 48, seed: int = 0) -> list[LengthRow]:
    """Prompts whose answer length follows an explicit request, answered by two models."""
    rng = random.Random(seed)
    rows = []
    for i in range(num_prompts):
        topic = TOPICS[i % len(TOPICS)]
        if i % 3 == 0:
            words = rng.choice((20, 50, 100, 200, 400))
            prompt, base = f"Describe {topic} in {words} words. ({i})", words * 1.3
        elif i % 3 == 1:
            prompt, base = f"Briefly, what is {topic}? Answer in one word. ({i})", 4.0
        else:
            prompt, base = f"Write a detailed essay about {topic}. ({i})", 600.0
        for model, factor in VERBOSITY.items():
            tokens = max(1, round(base * factor * rng.uniform(0.85, 1.15)))
            rows.append(LengthRow(prompt_id_of(prompt), prompt, model, tokens, "fixture"))
    return rows
