"""Build the tiny random-weight models that tests and demos serve with vLLM.

Nothing can be downloaded from a model hub here, so blockq makes its own models with random
weights from a fixed seed and a byte-level BPE tokenizer trained on
``app/demo/sample_prompts.jsonl``:

- ``--arch llama`` (tiny-llama): a 2-layer Llama (hidden 128, 4 heads of 32, 2 KV heads);
- ``--arch qwen2`` (tiny-qwen): a 3-layer Qwen2 (hidden 96, 3 heads of 32, 1 KV head, biased
  q/k/v projections, tied embeddings): another architecture and shape, the second model a
  multi-model fleet serves beside tiny-llama.

Both use the same tokenizer (trained the same way on the same prompts), so a prompt counts the
same tokens on either. The output is an ordinary Hugging Face model directory
(``config.json``, ``model.safetensors``, ``generation_config.json``, ``tokenizer.json``,
``tokenizer_config.json``) that vLLM and transformers load like any other.

Usage::

    python scripts/build_tiny_model.py --out .blockq/models/tiny-llama [--force]
    python scripts/build_tiny_model.py --arch qwen2 --out .blockq/models/tiny-qwen

NOTE: head_dim is 32 because vLLM's CPU attention has no kernel for head size 16.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.paths import ROOT, TINY_MODEL

DEFAULT_OUT = TINY_MODEL
DEFAULT_PROMPTS = ROOT / "app" / "demo" / "sample_prompts.jsonl"

#: Written last; its presence means the directory holds a complete model.
MARKER_FILE = "blockq-tiny-model.json"
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    MARKER_FILE,
)

UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
#: Each message renders as "<|role|>\ncontent\n"; the generation prompt is "<|assistant|>\n".
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

VOCAB_SIZE = 4000
MODEL_SHAPE = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,  # head_dim 32
    num_key_value_heads=2,
    max_position_embeddings=2048,
)
#: Architecture -> (its shape, whether the embeddings are tied to the output layer).
ARCHITECTURES = {
    "llama": (MODEL_SHAPE, False),
    "qwen2": (dict(
        hidden_size=96,
        intermediate_size=192,
        num_hidden_layers=3,
        num_attention_heads=3,  # head_dim 32
        num_key_value_heads=1,
        max_position_embeddings=2048,
    ), True),
}


def is_complete(out: Path) -> bool:
    """True when ``out`` holds every file of a finished build."""
    return all((out / name).is_file() for name in REQUIRED_FILES)


def _read_prompts(prompts_path: Path) -> list[str]:
    with prompts_path.open(encoding="utf-8") as f:
        return [json.loads(line)["prompt"] for line in f if line.strip()]


def _train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE (any text encodes) wrapped as a transformers fast tokenizer."""
    # NOTE: heavy imports live here so that the "already built" path stays fast.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [UNK, BOS, EOS, PAD, *ROLE_TOKENS]
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Role markers show up in rendered prompts: train on them so they sit in context.
    corpus = texts + [f"{role}\n{text}\n" for role, text in
              zip(ROLE_TOKENS * len(texts), texts, strict=False)]
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    # Like Llama: a BOS in front of every sequence.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )


def _make_tokenizer_config_portable(path: Path) -> None:
    """Spell tokenizer_config.json so that transformers 4.x loads it too (GPU nodes may run 4.x).

    NOTE: transformers 5 writes ``tokenizer_class: TokenizersBackend``, ``extra_special_tokens``
    and the chat template in a separate ``chat_template.jinja``; 4.x knows none of these. Both
    read ``PreTrainedTokenizerFast``, ``additional_special_tokens`` and an inline template.
    """
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["additional_special_tokens"] = list(ROLE_TOKENS)
    config.pop("extra_special_tokens", None)
    config["chat_template"] = CHAT_TEMPLATE
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _write_model(staging: Path, prompts_path: Path, seed: int, arch: str = "llama") -> dict:
    import torch
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    tokenizer = _train_tokenizer(_read_prompts(prompts_path), VOCAB_SIZE)
    tokenizer.save_pretrained(staging)
    _make_tokenizer_config_portable(staging / "tokenizer_config.json")
    bos_id, eos_id, pad_id = (tokenizer.convert_tokens_to_ids(t) for t in (BOS, EOS, PAD))

    shape, tied = ARCHITECTURES[arch]
    config_class, model_class = {"llama": (LlamaConfig, LlamaForCausalLM),
                                 "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]
    config = config_class(
        vocab_size=len(tokenizer),
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        tie_word_embeddings=tied,
        torch_dtype="bfloat16",
        **shape,
    )
    torch.manual_seed(seed)
    model = model_class(config).to(torch.bfloat16).eval()
    model.save_pretrained(staging, safe_serialization=True)
    GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id).save_pretrained(
        staging
    )
    return {
        "architecture": arch,
        "seed": seed,
        "vocab_size": len(tokenizer),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        **shape,
    }


def build_tiny_model(
    out: Path | str = DEFAULT_OUT,
    *,
    force: bool = False,
    seed: int = 0,
    prompts_path: Path | str = DEFAULT_PROMPTS,
    arch: str = "llama",
) -> Path:
    """Build the model into ``out`` unless a complete one is there (or ``force``); return ``out``.

    The build happens in a staging directory next to ``out`` that is renamed into place at the
    end, so a crashed or concurrent build never leaves a half-written model behind.
    """
    out = Path(out).resolve()
    if is_complete(out) and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        info = _write_model(staging, Path(prompts_path), seed, arch)
        (staging / MARKER_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        # mkdtemp makes a private directory; the model is meant to be read by other users
        # (containers, workers running under another account).
        staging.chmod(0o755)
        for path in staging.iterdir():
            path.chmod(0o644)
        if out.exists():
            if is_complete(out) and not force:  # another builder won the race
                return out
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=sorted(ARCHITECTURES), default="llama",
                        help="architecture (default: llama)")
    parser.add_argument("--out", type=Path, default=None,
                        help="model directory (default: .blockq/models/tiny-llama in the repo, "
                        "tiny-qwen for --arch qwen2)")
    parser.add_argument("--force", action="store_true", help="rebuild even if complete")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS,
                        help="JSONL with a 'prompt' field to train the tokenizer on")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = DEFAULT_OUT.parent / ("tiny-qwen" if args.arch == "qwen2" else "tiny-llama")

    if is_complete(args.out) and not args.force:
        print(f"tiny model already built at {args.out} (use --force to rebuild)")
        return 0
    started = time.perf_counter()
    out = build_tiny_model(args.out, force=args.force, seed=args.seed, prompts_path=args.prompts,
                           arch=args.arch)
    info = json.loads((out / MARKER_FILE).read_text(encoding="utf-8"))
    print(f"built tiny model at {out} in {time.perf_counter() - started:.1f} s")
    for key, value in info.items():
        print(f"  {key:<24} {value}")
    return 0
