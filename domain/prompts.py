"""The served model's tokenizer: render chat messages and count prompt tokens."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

__all__ = ["PromptCodec"]

_tokenizers: dict[str, Any] = {}
# NOTE: one loader at a time. transformers resolves its names lazily on first import, and two
# threads importing it at once make one of them fail ("cannot import name 'AutoTokenizer'").
_load_lock = threading.Lock()


def _load_tokenizer(model_path: str) -> Any:
    tokenizer = _tokenizers.get(model_path)
    if tokenizer is None:
        with _load_lock:
            tokenizer = _tokenizers.get(model_path)
            if tokenizer is None:
                # Heavy: imported only by processes that count tokens.
                from transformers import AutoTokenizer  # noqa: PLC0415

                tokenizer = _tokenizers[model_path] = AutoTokenizer.from_pretrained(model_path)
    return tokenizer


class PromptCodec:
    """The tokenizer of one model directory, loaded once per process and shared (thread-safe)."""

    def __init__(self, model_path: Path) -> None:
        self.model_path = model_path

    @property
    def tokenizer(self) -> Any:
        return _load_tokenizer(str(self.model_path))

    def warm_up(self) -> None:
        """Load now rather than in the first request (it takes seconds)."""
        _ = self.tokenizer

    def render(self, messages: list[dict[str, str]]) -> str:
        """Messages as the prompt text the engine receives, with the model's chat template."""
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )

    def count(self, text: str) -> int:
        """Prompt tokens as the engine counts them (special tokens included)."""
        return len(self.token_ids(text))

    def token_ids(self, text: str) -> list[int]:
        """The prompt's token ids as the engine tokenizes it (special tokens included)."""
        return list(self.tokenizer(text)["input_ids"])

    @property
    def vocab_size(self) -> int:
        """Token ids the tokenizer knows (0 to vocab_size - 1), added tokens included."""
        return len(self.tokenizer)

    def decode(self, token_ids: list[int]) -> str:
        """The text of a prompt given as token ids (special tokens kept, as the engine sees
        them)."""
        return str(self.tokenizer.decode(token_ids))
