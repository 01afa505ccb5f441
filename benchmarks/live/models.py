"""Several models on one live fleet (issue 31, fleet (b)): each model's instances keep their
model's name, and each request names one model, drawn with the run's seed by the declared shares
(`--model-share MODEL=SHARE`). The stack routes a request among its model's instances only, so
the figures that compare with the discrete-event benchmark are each pool's (`split_by_model`).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from pathlib import Path

from benchmarks.live.stats import summarize
from benchmarks.live.workloads import LiveWorkload
from workers.sim.fleet_declaration import InstanceSpec

__all__ = ["assign_models", "fleet_models", "parse_model_shares", "split_by_model", "stack_fleet"]


def parse_model_shares(texts: Sequence[str]) -> dict[str, float]:
    """``["llama-2-7b=0.75", "llama-3-8b=0.25"]`` -> the shares, normalised to sum to 1, in the
    order given (the order of the draw's intervals)."""
    shares: dict[str, float] = {}
    for text in texts:
        model, sep, value = text.partition("=")
        try:
            share = float(value)
        except ValueError:
            share = math.nan
        if not sep or not model or not share > 0 or math.isinf(share):
            raise ValueError(f"model share {text!r}: expected MODEL=SHARE with SHARE > 0")
        if model in shares:
            raise ValueError(f"model share {text!r}: {model} given twice")
        shares[model] = share
    total = sum(shares.values())
    return {model: share / total for model, share in shares.items()}


def fleet_models(specs: Sequence[InstanceSpec]) -> list[str]:
    """The models a fleet serves, in declaration order."""
    return list(dict.fromkeys(spec.model for spec in specs))


def stack_fleet(specs: Sequence[InstanceSpec], *, serving_model: str,
                model_path: Path) -> list[InstanceSpec]:
    """The fleet as the benchmark's stack runs it, every instance emulated. One model: every
    entry serves the workload's `serving_model` (the name the length model is asked for).
    Several: each keeps its model's name (what a request names), and every model counts prompt
    tokens with the served tokenizer at `model_path` (the emulated hardware differs, the
    tokenizer does not)."""
    if len(fleet_models(specs)) == 1:
        return [spec.model_copy(update={"model": serving_model, "engine": "emulated"})
                for spec in specs]
    return [spec.model_copy(update={"engine": "emulated", "model_path": model_path})
            for spec in specs]


def assign_models(workload: LiveWorkload, shares: dict[str, float], seed: int) -> LiveWorkload:
    """The workload with each request naming a model: one uniform draw a request from a
    generator seeded by `seed`, the shares' intervals in their order. The requests, their order
    and arrival times are unchanged: each pool receives its share of one arrival process."""
    if not shares:
        raise ValueError("no model shares")
    rng = random.Random(f"{seed}:model-shares")
    models, bounds, total = list(shares), [], 0.0
    for share in shares.values():
        total += share
        bounds.append(total)

    def draw() -> str:
        u = rng.random() * total
        return next((m for m, bound in zip(models, bounds, strict=True) if u < bound),
                    models[-1])

    requests = [dataclasses.replace(r, model=draw()) for r in workload.requests]
    counts = {m: sum(1 for r in requests if r.model == m) for m in models}
    note = "models drawn per request (seed {}): {}".format(
        seed, ", ".join(f"{m} {counts[m]} ({shares[m]:.0%} declared)" for m in models))
    return dataclasses.replace(workload, requests=requests, notes=[*workload.notes, note])


def split_by_model(models: Sequence[str | None], ttft_wall_s: Sequence[float],
                   e2e_wall_s: Sequence[float], time_scale: float,
                   routed_wall_s: Sequence[float] | None = None) -> dict[str, dict]:
    """Each model's (pool's) request count and TTFT / end-to-end summaries in emulated s, from
    per-request wall latencies aligned with `models` (inf: never happened); with
    `routed_wall_s`, the time from acceptance to routing too (the control plane's share of
    the TTFT). Empty when no request names a model."""
    out: dict[str, dict] = {}
    for model in dict.fromkeys(m for m in models if m is not None):
        mine = [i for i, m in enumerate(models) if m == model]
        out[model] = {"requests": len(mine),
                      "ttft_s": summarize([ttft_wall_s[i] for i in mine], time_scale).as_dict(),
                      "e2e_s": summarize([e2e_wall_s[i] for i in mine], time_scale).as_dict()}
        if routed_wall_s is not None:
            out[model]["accept_to_routed_s"] = summarize(
                [routed_wall_s[i] for i in mine], time_scale).as_dict()
    return out
