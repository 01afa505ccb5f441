"""Fixed length predictions looked up by prompt: Settings.length_predictor 'table'.

A benchmark injects predictions it chose (the true lengths for an oracle, one mean length for
every request, a noise model's draws) so that every policy goes through the same predict worker
and the same route task as the learned model does. The table is a JSONL file, one object per
line with `prompt` (the prompt text, or the chat messages as a list) and `predicted_tokens`
(a positive integer); the last line of a prompt wins.

A prompt the table does not hold gets the table's mean (rounded), and the answer is labelled
`MISSING_NAME` so that the request's `predictor` column shows it: a benchmark counts those and
refuses a run that has any. The values are used as they are (capped by the request's
max_tokens): the bias watch's correction does not scale them, so an oracle stays an oracle.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from workers.predict.features import Prompt

__all__ = ["MISSING_NAME", "TABLE_NAME", "PredictionTable", "prompt_key"]

#: Predictor name recorded with a request whose prompt is in the table.
TABLE_NAME = "table"
#: Predictor name recorded with a request whose prompt is not: it got the table's mean.
MISSING_NAME = "table.missing"


def prompt_key(prompt: Prompt) -> str:
    """The table's key of a prompt: the text itself, or chat messages as canonical JSON."""
    if isinstance(prompt, str):
        return prompt
    return json.dumps([dict(m) for m in prompt], sort_keys=True, ensure_ascii=False)


@dataclass(frozen=True)
class PredictionTable:
    predictions: Mapping[str, int]

    def __post_init__(self) -> None:
        if not self.predictions:
            raise ValueError("a length prediction table needs at least one prompt")

    @classmethod
    def from_jsonl(cls, path: str | Path) -> PredictionTable:
        """Rows with `prompt` and `predicted_tokens`; raises ValueError naming a bad line."""
        predictions: dict[str, int] = {}
        with Path(path).open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    tokens = row["predicted_tokens"]
                    prompt = row["prompt"]
                    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
                        raise ValueError(f"predicted_tokens must be a positive integer, "
                                         f"got {tokens!r}")
                    if not isinstance(prompt, (str, list)) or not prompt:
                        raise ValueError("prompt must be a non-empty text or message list")
                except (ValueError, KeyError, TypeError) as error:
                    raise ValueError(f"{path}:{number}: {error!r}") from None
                predictions[prompt_key(prompt)] = tokens
        return cls(predictions)

    @property
    def mean_tokens(self) -> int:
        return max(1, round(sum(self.predictions.values()) / len(self.predictions)))

    def lookup(self, prompt: Prompt, *, max_tokens: int) -> tuple[int, str]:
        """(predicted tokens capped by max_tokens, predictor name): `TABLE_NAME` when the
        prompt is in the table, else the mean and `MISSING_NAME`."""
        known = self.predictions.get(prompt_key(prompt))
        tokens, name = (known, TABLE_NAME) if known is not None else (self.mean_tokens,
                                                                      MISSING_NAME)
        return max(1, min(max_tokens, tokens)), name
