"""The served model's tokenizer: render chat messages and count prompt tokens."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["PromptCodec"]


@lru_cache(maxsize=4)
def _load_tokenizer(model_path: str) -> Any:
    from transformers import AutoTokenizer  # noqa: PLC0415 - heavy; only processes that count

    return AutoTokenizer.from_pretrained(model_path)


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
        return len(self.tokenizer(text)["input_ids"])
