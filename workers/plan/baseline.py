"""The routing-blind baseline, of Mélange's kind (arXiv 2404.14527): the cheapest GPU mix for
request-size buckets, assuming the work splits as the program says.

Requests are bucketed by prompt and output length. Each kind's throughput on a bucket is one
instance's saturated rate on that bucket's requests (`workers.cluster_sim.saturation_rate`),
zero where more than 1 % of the bucket's lone requests already miss a target on that kind
(unless no kind does better: then the kinds that miss least take it). An integer
program then picks instance counts ``n_k`` and the share ``x_kb`` of bucket ``b`` each kind takes:

    minimise  sum_k price_k n_k
    such that sum_k x_kb = 1 for every bucket, sum_b rate_b x_kb / tput_kb <= n_k for every kind,
              n_k integer, 0 <= n_k <= max_count_k, x_kb >= 0 (0 where tput_kb = 0)

(`scipy.optimize.milp`). Nothing in it knows the router: the plan is then checked in the
simulation with the production router, like every other fleet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from workers.cluster_sim import Workload, saturation_rate

from .derive import KindModel

__all__ = ["OUTPUT_EDGES", "PROMPT_EDGES", "Bucket", "buckets_of", "routing_blind_mix"]

#: Bucket edges (tokens): a bucket holds lengths in [edge_i, edge_i+1).
PROMPT_EDGES = (0, 256, 1024, 2048, math.inf)
OUTPUT_EDGES = (0, 64, 256, 1024, math.inf)
#: Requests of a bucket a saturated rate is measured on, at most.
SATURATION_SAMPLE = 400


@dataclass(frozen=True, slots=True)
class Bucket:
    """Requests of one prompt-size by output-size cell."""

    label: str
    #: Their indices in the model's workload.
    indices: tuple[int, ...]


def buckets_of(workload: Workload) -> list[Bucket]:
    """The non-empty buckets of `workload`, by prompt then output size."""
    cells: dict[tuple[int, int], list[int]] = {}
    for index, (prompt, output) in enumerate(zip(workload.num_prompt_tokens,
                                                 workload.num_output_tokens, strict=True)):
        cells.setdefault((_cell(prompt, PROMPT_EDGES), _cell(output, OUTPUT_EDGES)),
                         []).append(index)
    return [Bucket(f"p{PROMPT_EDGES[p]}-{PROMPT_EDGES[p + 1]}/o{OUTPUT_EDGES[o]}-"
                   f"{OUTPUT_EDGES[o + 1]}", tuple(rows)) for (p, o), rows in sorted(cells.items())]


def _cell(length: int, edges: Sequence[float]) -> int:
    return next(i for i in range(len(edges) - 1) if length < edges[i + 1])


def _subset(workload: Workload, indices: Sequence[int]) -> Workload:
    picked = indices[:SATURATION_SAMPLE]
    return Workload(workload.name, tuple(float(i) for i in range(len(picked))),
                    tuple(workload.num_prompt_tokens[i] for i in picked),
                    tuple(workload.num_output_tokens[i] for i in picked))


def routing_blind_mix(workload: Workload, rate: float, models: Mapping[str, KindModel],
                      prices: Mapping[str, float], max_counts: Mapping[str, int | None],
                      serves: Mapping[str, Sequence[bool]]) -> dict[str, int] | None:
    """Instance counts by kind for `workload` at `rate` (None: the program has no solution).

    `serves[kind][i]` says whether a lone request `i` meets its targets on that kind: a bucket
    is served by a kind only if 99 % of its requests would, or, where no kind reaches 99 %, by
    the kinds that serve the largest share of it (every kind, where none serves any).
    """
    from scipy.optimize import Bounds, LinearConstraint, milp

    kinds = list(models)
    buckets = buckets_of(workload)
    total = len(workload)
    shares = np.array([[sum(serves[kind][i] for i in bucket.indices) / len(bucket.indices)
                        for bucket in buckets] for kind in kinds])
    throughput = np.zeros((len(kinds), len(buckets)))
    for b, bucket in enumerate(buckets):
        # A bucket no kind serves at 99 % goes to the kinds that serve most of it (the fastest);
        # one no kind serves at all, to every kind (by throughput alone).
        best = shares[:, b].max()
        for k, kind in enumerate(kinds):
            if shares[k, b] >= min(0.99, best):
                throughput[k, b] = saturation_rate(_subset(workload, bucket.indices),
                                                   models[kind].config, models[kind].exec_model)
    # Variables: n_k (integer), then x_kb (row-major by kind).
    num_n, num_x = len(kinds), len(kinds) * len(buckets)
    cost = np.concatenate([[prices[k] for k in kinds], np.zeros(num_x)])
    rows, lower, upper = [], [], []
    for b in range(len(buckets)):  # every bucket fully assigned
        row = np.zeros(num_n + num_x)
        row[[num_n + k * len(buckets) + b for k in range(len(kinds))]] = 1.0
        rows.append(row), lower.append(1.0), upper.append(1.0)
    for k in range(len(kinds)):  # each kind's load within its instances
        row = np.zeros(num_n + num_x)
        row[k] = -1.0
        for b, bucket in enumerate(buckets):
            if throughput[k, b] > 0:
                row[num_n + k * len(buckets) + b] = (rate * len(bucket.indices) / total
                                                     / throughput[k, b])
        rows.append(row), lower.append(-np.inf), upper.append(0.0)
    x_upper = [1.0 if throughput[k, b] > 0 else 0.0
               for k in range(len(kinds)) for b in range(len(buckets))]
    n_upper = [np.inf if max_counts[k] is None else float(max_counts[k]) for k in kinds]
    result = milp(cost, constraints=LinearConstraint(np.array(rows), lower, upper),
                  integrality=np.concatenate([np.ones(num_n), np.zeros(num_x)]),
                  bounds=Bounds(np.zeros(num_n + num_x), np.array(n_upper + x_upper)))
    if not result.success:
        return None
    counts = {kind: int(round(result.x[k])) for k, kind in enumerate(kinds)}
    return {kind: count for kind, count in counts.items() if count > 0}
