"""Output lengths of the emulated engine's requests: how many tokens a request would generate
before max_tokens or max_model_len cut it, from one of the registered sources."""

from __future__ import annotations

import bisect
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Self

from workers.registry import Registry
from workers.serve.engine import GenerationRequest

__all__ = [
    "OUTPUT_LENGTHS",
    "AnswerLengths",
    "MaxTokensLengths",
    "OutputLengthSource",
    "OutputLengths",
    "SHAREGPT_OUTPUT_QUANTILES",
    "ShareGptLengths",
    "sharegpt_output_tokens",
]

#: Output-length distribution of ShareGPT answers (Llama-2 tokens): (percentile, tokens) pairs,
#: from the 10,000 requests of ../shared/data/traces/vidur_opt_scheduler/sharegpt_val_10k_llama2.csv
#: (column num_decode_tokens, numpy.percentile, rounded). Mean 326, median 286.
SHAREGPT_OUTPUT_QUANTILES: tuple[tuple[float, int], ...] = (
    (0.0, 3), (2.5, 12), (5.0, 23), (7.5, 33), (10.0, 44), (15.0, 75), (20.0, 106),
    (25.0, 136), (30.0, 167), (35.0, 201), (40.0, 232), (45.0, 260), (50.0, 286), (55.0, 314),
    (60.0, 341), (65.0, 371), (70.0, 405), (75.0, 446), (80.0, 502), (85.0, 571), (90.0, 681),
    (92.5, 754), (95.0, 839), (97.5, 938), (99.0, 1000), (99.5, 1044), (100.0, 1734),
)


class OutputLengths(Protocol):
    """How many tokens a request would generate if max_tokens did not stop it."""

    def __call__(self, request: GenerationRequest) -> int: ...


class OutputLengthSource(OutputLengths, Protocol):
    """One of `OUTPUT_LENGTHS`: an `OutputLengths` buildable from the emulated engine's settings."""

    @classmethod
    def configure(cls, answers_path: Path | None, model: str | None = None) -> Self:
        """The source as Settings choose it (`answers_path`: emulated_answers_path; `model`:
        the served model of the instance)."""
        ...


#: Output-length sources by name (Settings.emulated_output_lengths).
OUTPUT_LENGTHS: Registry[OutputLengthSource] = Registry("emulated output-length source")


@OUTPUT_LENGTHS.register("sharegpt")
@dataclass(frozen=True, slots=True)
class ShareGptLengths:
    """Draws from `SHAREGPT_OUTPUT_QUANTILES` (inverse CDF, linear between quantiles).

    NOTE: the draw is a deterministic function of (seed, request_id): an output length is a
    property of the request, not of the instance serving it, so a request re-routed after a
    crash, or replayed on another instance, produces the same length there.
    """

    seed: int = 0

    @classmethod
    def configure(cls, answers_path: Path | None, model: str | None = None) -> ShareGptLengths:
        return cls()

    def __call__(self, request: GenerationRequest) -> int:
        # random.Random seeds a str through SHA-512: the same in every process (unlike hash()).
        u = random.Random(f"{self.seed}:{request.request_id}").random() * 100.0
        return sharegpt_output_tokens(u)


@OUTPUT_LENGTHS.register("max_tokens")
@dataclass(frozen=True, slots=True)
class MaxTokensLengths:
    """Every request generates exactly max_tokens (an EOS-free model; replay benchmarks)."""

    @classmethod
    def configure(cls, answers_path: Path | None, model: str | None = None
                  ) -> MaxTokensLengths:
        return cls()

    def __call__(self, request: GenerationRequest) -> int:
        return request.max_tokens


@OUTPUT_LENGTHS.register("answers")
@dataclass(frozen=True)
class AnswerLengths:
    """The length of a real answer to the same prompt (prompt text -> output tokens), for
    replaying real conversations; prompts without a known answer draw from ShareGPT.

    Two models answer one prompt at unlike lengths: a row may name its `model`, and an
    instance takes the rows of its own served model over the rows that name none."""

    answers: Mapping[str, int]
    fallback: OutputLengths = field(default_factory=ShareGptLengths)

    @classmethod
    def configure(cls, answers_path: Path | None, model: str | None = None) -> AnswerLengths:
        if answers_path is None:
            raise ValueError("emulated_output_lengths 'answers' needs emulated_answers_path")
        return cls.from_jsonl(answers_path, model=model)

    @classmethod
    def from_jsonl(cls, path: Path, *, model: str | None = None) -> AnswerLengths:
        """Rows with `prompt` (text), `output_tokens` and optionally `model`; the last row of a
        prompt wins, a row naming `model` over one naming no model. Rows naming another model
        are left out."""
        general: dict[str, int] = {}
        own: dict[str, int] = {}
        with Path(path).open() as lines:
            for row in (json.loads(line) for line in lines if line.strip()):
                if row.get("model") is None:
                    general[row["prompt"]] = int(row["output_tokens"])
                elif row["model"] == model:
                    own[row["prompt"]] = int(row["output_tokens"])
        return cls({**general, **own})

    def __call__(self, request: GenerationRequest) -> int:
        known = self.answers.get(request.prompt)
        return known if known is not None else self.fallback(request)


def sharegpt_output_tokens(percentile: float) -> int:
    """The ShareGPT output length at `percentile` (0-100), interpolated between quantiles."""
    points = SHAREGPT_OUTPUT_QUANTILES
    index = bisect.bisect_right([p for p, _ in points], percentile)
    if index >= len(points):
        return points[-1][1]
    (p0, v0), (p1, v1) = points[index - 1], points[index]
    return max(1, round(v0 + (v1 - v0) * (percentile - p0) / (p1 - p0)))
