"""Where work goes when an instance returns empty beside a backlogged pool (issue 44), from the
routing's own pure functions, no services: deterministic counts, not timings.

1. The rebalance (`workers.health.rebalance.WhatIfPlan`): how many of the waiting requests the
   returned instance takes by the what-if, and from which instance, against the count rule it
   replaced (the newest half of each instance's waiting requests, up to max_num_seqs, sent
   back to routing).
2. The next requests routed, one by one with no republish between (each decision sees the ones
   before it as assigned): how many each policy that reads no prediction sends to the returned
   instance. Round robin is the bias watch's fallback today (workers/route/pipeline.py).

    .venv/bin/python scripts/bench_returning_instance.py
"""

from __future__ import annotations

import argparse
import random

from workers.health.rebalance import WhatIfPlan
from workers.route.policies import RequestView, RoutingContext, decide, view_of
from workers.sim.engine_state import EngineState, RequestState
from workers.sim.exec_model import bundled_model
from workers.sim.published import Published
from workers.sim.snapshot import SimRequest

__all__ = ["main"]

RETURNED = "gpu.1"
#: Each instance: the Block paper's A30 serving Qwen2-7B, as the tests' idle instance.
KV_BLOCKS, BLOCK_SIZE, MAX_NUM_SEQS = 7288, 16, 48
FALLBACK_CANDIDATES = ("round_robin", "least_requests", "infaas", "llumnix")


def published(name: str, running: int, waiting: int, tokens: int) -> Published:
    """An instance with `running` requests half done and `waiting` never started, each of
    `tokens` prompt tokens and `tokens` predicted output tokens."""
    requests = [RequestState(f"{name}-r{i}", tokens, tokens + tokens // 2, tokens // 2, tokens,
                             is_running=True) for i in range(running)]
    requests += [RequestState(f"{name}-w{i}", tokens, 0, 0, tokens, is_running=False)
                 for i in range(waiting)]
    used = running * -(-(tokens + tokens // 2) // BLOCK_SIZE)
    state = EngineState(
        engine_kind="emulated", model="big", num_running=running, num_waiting=waiting,
        num_total_blocks=KV_BLOCKS, num_free_blocks=KV_BLOCKS - used, block_size=BLOCK_SIZE,
        max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=512, max_model_len=4096,
        requests=tuple(requests), taken_at=0.0)
    return Published(state.to_instance_snapshot(), (), None)


def pool(backlog: tuple[int, int], running: int, tokens: int) -> dict[str, Published]:
    return {"gpu.0": published("gpu.0", running, backlog[0], tokens),
            RETURNED: published(RETURNED, 0, 0, tokens),
            "gpu.2": published("gpu.2", running, backlog[1], tokens)}


def rebalance_row(backlog: tuple[int, int], running: int, tokens: int, exec_model: str
                  ) -> tuple[str, ...]:
    instances = pool(backlog, running, tokens)
    plan = WhatIfPlan(instances, dict.fromkeys(instances, bundled_model(exec_model)), RETURNED)
    taken = {"gpu.0": 0, "gpu.2": 0}
    while sum(taken.values()) < 256 and (move := plan.best_move(list(taken))) is not None:
        plan.apply(move)
        taken[move.donor] += 1
    seats = instances[RETURNED].snapshot.config.max_num_seqs
    count_rule = min(seats, sum(max(w // 2, 1) for w in backlog))
    return (f"{backlog[0]} / {backlog[1]}", str(sum(taken.values())),
            f"{taken['gpu.0']} / {taken['gpu.2']}", str(count_rule))


def routing_row(policy: str, backlog: tuple[int, int], running: int, tokens: int,
                arrivals: int) -> tuple[str, ...]:
    instances = pool(backlog, running, tokens)
    counts = dict.fromkeys(instances, 0)
    for k in range(arrivals):
        request = RequestView(f"n{k}", tokens, tokens, 4 * tokens)
        views = [view_of(i, instances[i])[0] for i in sorted(instances)]
        chosen = decide(policy, request, views, RoutingContext(ticket=k, rng=random.Random(k)))
        counts[chosen.instance_id] += 1
        before = instances[chosen.instance_id]
        instances[chosen.instance_id] = Published(
            before.snapshot, (*before.assigned, SimRequest(f"n{k}", tokens,
                                                          predicted_output_tokens=tokens)), None)
    return (policy, str(counts[RETURNED]), f"{counts['gpu.0']} / {counts['gpu.2']}")


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200,
                        help="Prompt and predicted output tokens of every request.")
    parser.add_argument("--running", type=int, default=8,
                        help="Requests running on each backlogged instance.")
    parser.add_argument("--arrivals", type=int, default=30)
    parser.add_argument("--exec-model", default="llama-2-7b-a100")
    args = parser.parse_args()
    backlogs = [(12, 6), (50, 50), (60, 40)]
    print(f"Rebalance: a returned empty instance beside two with {args.running} running and "
          f"these waiting ({args.tokens}-token prompts and predictions, {args.exec_model})\n")
    print(table(("waiting on gpu.0 / gpu.2", "moved by the what-if", "from gpu.0 / gpu.2",
                 "count rule (to routing)"),
                [rebalance_row(b, args.running, args.tokens, args.exec_model)
                 for b in backlogs]))
    print(f"\nThe next {args.arrivals} requests, waiting 40 / 40, routed by policies that read "
          "no prediction\n")
    print(table(("policy", f"to the returned {RETURNED}", "to gpu.0 / gpu.2"),
                [routing_row(p, (40, 40), args.running, args.tokens, args.arrivals)
                 for p in FALLBACK_CANDIDATES]))
    return 0
