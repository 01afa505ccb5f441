"""The served model's tokenizer: render chat messages and count prompt tokens."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

__all__ = ["PromptCodec"]


class PromptCodec:
    """Loads the tokenizer on first use (transformers is slow to import), then is thread-safe."""

    def __init__(self, model_path: Path) -> None:
        self.model_path = model_path
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            with self._lock:
                if self._tokenizer is None:
                    from transformers import AutoTokenizer  # NOTE: heavy; loaded on first use

                    self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
        return self._tokenizer

    def render(self, messages: list[dict[str, str]]) -> str:
        """Messages as the prompt text the engine receives, with the model's chat template."""
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )

    def count(self, text: str) -> int:
        """Prompt tokens as the engine counts them (special tokens included)."""
        return len(self.tokenizer(text)["input_ids"])
