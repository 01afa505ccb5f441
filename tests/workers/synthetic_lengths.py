"""Synthetic length rows: prompts whose answer length follows an explicit request, answered by
two serving models of different verbosity (the length predictor's and the learning loop's data)."""

from __future__ import annotations

import random

from workers.predict.dataset import LengthRow, prompt_id_of

TOPICS = ("tea", "rivers", "the moon", "compilers", "bees", "jazz", "glaciers", "chess",
          "bridges", "volcanoes", "owls", "printing", "salt", "trains", "maps", "clocks")
#: Serving models of the fixture and how verbose each is.
VERBOSITY = {"small-model": 0.6, "big-model": 1.5}


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
