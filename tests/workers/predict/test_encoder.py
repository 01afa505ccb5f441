"""The encoder: any local Hugging Face encoder, pooled per layer, order kept, head+tail kept."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from workers.predict.encoder import Encoder, EncoderConfig


def test_embeddings_are_unit_norm_per_layer_and_in_input_order(tiny_encoder: Encoder) -> None:
    texts = ["a much longer text " * 20, "short", "", "medium length text here", "short"]
    out = tiny_encoder.embed(texts)
    assert out.shape == (5, 2 * 32) and out.dtype == np.float32
    blocks = out.reshape(5, 2, 32)
    np.testing.assert_allclose(np.linalg.norm(blocks, axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(out[1], out[4], rtol=1e-6)  # same text, same place after sorting
    np.testing.assert_allclose(tiny_encoder.embed([texts[3]])[0], out[3], atol=1e-5)
    assert tiny_encoder.embed([]).shape == (0, 64)


def test_long_prompts_keep_their_head_and_tail(tiny_encoder: Encoder) -> None:
    ids = list(range(1000, 1200))
    kept = tiny_encoder._truncate(ids)
    body = tiny_encoder.max_seq_len - 2  # [CLS] and [SEP]
    assert len(kept) == body
    num_tail = int(body * tiny_encoder.config.tail_share)
    assert kept[: body - num_tail] == ids[: body - num_tail] and kept[-num_tail:] == ids[-num_tail:]
    assert tiny_encoder._truncate(ids[:10]) == ids[:10]


def test_fewer_layers_and_bad_settings(tiny_encoder_dir: Path) -> None:
    one = Encoder(EncoderConfig(path=str(tiny_encoder_dir), dtype="float32", num_layers=1,
                                layers=(0, 1)))
    assert len(one.model.encoder.layer) == 1 and one.dim == 64
    assert one.embed(["hello"]).shape == (1, 64)
    with pytest.raises(ValueError, match="num_layers"):
        Encoder(EncoderConfig(path=str(tiny_encoder_dir), num_layers=3))
    with pytest.raises(ValueError, match="out of range"):
        Encoder(EncoderConfig(path=str(tiny_encoder_dir), layers=(5,)))
    with pytest.raises(ValueError, match="dtype"):
        Encoder(EncoderConfig(path=str(tiny_encoder_dir), dtype="float16"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_frozen_pass_embeds_as_the_eager_module_does(tiny_encoder_dir: Path,
                                                         dtype: str) -> None:
    """The traced graph is a fixed recording: it must still follow every width, every batch
    size and the padding mask (traced on a padded pass, a one-row pass unpadded), as eager
    mode does."""
    config = EncoderConfig(path=str(tiny_encoder_dir), dtype=dtype, max_seq_len=48,
                           layers=(0, -1), batch_size=3)
    frozen = Encoder(config)
    eager = Encoder(dataclasses.replace(config, frozen=False))
    texts = ["", "hi", "a much longer text about many things " * 12, "two words",
             "medium length text here, with punctuation!", "x " * 20, "short"]
    for batch in ([t] for t in texts):
        np.testing.assert_allclose(frozen.embed(batch), eager.embed(batch), atol=2e-3)
    np.testing.assert_allclose(frozen.embed(texts), eager.embed(texts), atol=2e-3)
    # Padding changes nothing: a text alone and beside a longer one embed alike.
    alone = frozen.embed(["two words"])[0]
    beside = frozen.embed(["two words", texts[2]])[0]
    np.testing.assert_allclose(alone, beside, atol=2e-3)


def test_an_encoder_the_tracer_cannot_follow_runs_eagerly(
        tiny_encoder_dir: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    import torch

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("cannot trace this module")

    monkeypatch.setattr(torch.jit, "trace", refuse)
    config = EncoderConfig(path=str(tiny_encoder_dir), dtype="float32", layers=(-1,))
    eager = Encoder(config)
    assert "runs eagerly" in caplog.text and "cannot trace this module" in caplog.text
    monkeypatch.undo()
    np.testing.assert_allclose(eager.embed(["hello there"]),
                               Encoder(config).embed(["hello there"]), atol=2e-3)
