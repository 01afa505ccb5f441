"""Does releasing a batch's lines by prefix group let the engines' prefix cache serve them?

A batch whose lines open with one of a few shared system prompts (the typical bulk job), in an
interleaved file order, released as the releaser releases it: a window of `--window` lines in
flight (max_batch_in_flight), topped up every `--release-interval` seconds, either in file order
(the releaser before prefix groups) or by prefix group (workers.batch.prefix_groups: the keys and
group numbers expansion computes, then (group, line) order). Each released line is routed by the
`--policy` router (workers.route.policies, its what-ifs crediting each instance's published
cache) to one of `--instances` simulated instances with prefix caching (the cluster benchmark's
ground truth: workers.sim's scheduler model, noisy Qwen2-7B/A30 step times). Emulated time, no
stack. Prints, per KV-cache size and order, the share of prompt tokens the cache served and
when the batch's last line finished.

    .venv/bin/python scripts/bench_batch_prefix_groups.py --lines 2000 --prefixes 20

NOTE: the router sees each instance's present state at every release (instances publish then);
lines of one release round see the ones routed before them in the same round (the ledger).
Output lengths are ShareGPT's, the router plans with their mean.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

from benchmarks.tables import print_table
from workers.batch.prefix_groups import PrefixGroups, prefix_key
from workers.cluster_sim import GroundTruthInstance, SimulatedRequest
from workers.route.policies import (
    FleetLedger,
    RequestView,
    RoutingContext,
    decide,
    needs_what_if,
)
from workers.serve.output_lengths import sharegpt_output_tokens
from workers.sim import InstanceConfig, SimRequest, bundled_model
from workers.sim.snapshot import live_prefix_unit_tokens, prefix_unit_hashes

VOCAB = 32_000
MAX_MODEL_LEN = 4096


@dataclass(frozen=True, slots=True)
class Line:
    """One batch line: its prompt's token ids and its true output length."""

    number: int  # 1-based, in the file
    token_ids: tuple[int, ...]
    num_prefix_tokens: int  # of its shared system prompt
    num_output_tokens: int


def make_batch(args: argparse.Namespace) -> list[Line]:
    """`--lines` lines, each a shared prompt drawn uniformly (interleaved) and a unique suffix."""
    rng = random.Random(args.seed)
    prefixes = [tuple(rng.randrange(VOCAB) for _ in range(args.prefix_tokens))
                for _ in range(args.prefixes)]
    lines = []
    for number in range(1, args.lines + 1):
        prefix = prefixes[rng.randrange(args.prefixes)]
        suffix = tuple(rng.randrange(VOCAB)
                       for _ in range(rng.randint(args.suffix_min, args.suffix_max)))
        room = MAX_MODEL_LEN - len(prefix) - len(suffix)
        output = max(1, min(room, sharegpt_output_tokens(rng.random() * 100.0)))
        lines.append(Line(number, prefix + suffix, len(prefix), output))
    return lines


def grouped(lines: list[Line]) -> list[Line]:
    """The lines in the releaser's order: by prefix group (as expansion numbers them), then
    file order."""
    groups = PrefixGroups()
    group = {line.number: groups.group_of(line.number, prefix_key(line.token_ids))
             for line in lines}
    return sorted(lines, key=lambda line: (group[line.number], line.number))


@dataclass
class Outcome:
    hit_rate: float  # prompt tokens the cache served / prompt tokens
    prefix_hit_rate: float  # of the shared prompts' tokens
    done_s: float  # when the last line finished
    mean_e2e_s: float  # release to finish
    num_preemptions: int


def run(lines: list[Line], order: list[Line], num_blocks: int,
        args: argparse.Namespace) -> Outcome:
    """Release `order` through the window, route, and run the instances to the end."""
    config = InstanceConfig(num_total_blocks=num_blocks, block_size=16, max_num_seqs=48,
                            max_num_batched_tokens=512, max_model_len=MAX_MODEL_LEN,
                            enable_prefix_caching=True,
                            prefix_block_size=live_prefix_unit_tokens(16))
    model = bundled_model("qwen2-7b-a30")
    engines = [GroundTruthInstance(f"gpu.{k}", config, model, noise_sigma=0.1, seed=[args.seed, k])
               for k in range(args.instances)]
    ledger = FleetLedger()
    what_if_model = model if needs_what_if(args.policy) else None
    rng = random.Random(args.seed)
    predicted = round(sum(line.num_output_tokens for line in lines) / len(lines))
    requests: list[SimulatedRequest] = []
    pending = list(reversed(order))
    now_s = 0.0
    while pending:
        for engine in engines:
            engine.run_until(now_s)
            ledger.publish(engine.instance_id, engine.snapshot(), now_s)
        in_flight = sum(1 for r in requests if r.finish_s is None or r.finish_s > now_s)
        for _ in range(min(len(pending), args.window - in_flight)):
            line = pending.pop()
            request = SimulatedRequest(
                f"l{line.number}", now_s, len(line.token_ids), line.num_output_tokens,
                predicted, prefix_unit_hashes(line.token_ids, config.prefix_unit_tokens))
            requests.append(request)
            _route(request, engines, ledger, what_if_model, rng, args.policy, len(requests),
                   now_s)
        now_s += args.release_interval
    for engine in engines:
        engine.run_to_end()
    return _outcome(lines, requests, engines)


def _route(request: SimulatedRequest, engines: list[GroundTruthInstance], ledger: FleetLedger,
           what_if_model: object, rng: random.Random, policy: str, ticket: int,
           now_s: float) -> None:
    planned = SimRequest(request.request_id, request.num_prompt_tokens,
                         predicted_output_tokens=request.predicted_output_tokens,
                         prefix_hashes=request.prefix_hashes)
    view = RequestView(request.request_id, request.num_prompt_tokens,
                       request.predicted_output_tokens,
                       max_tokens=MAX_MODEL_LEN - request.num_prompt_tokens, priority_class=1)
    views = ledger.views(planned, what_if_model)  # type: ignore[arg-type]
    decision = decide(policy, view, views, RoutingContext(ticket=ticket, rng=rng))
    next(e for e in engines if e.instance_id == decision.instance_id).add(request, now_s)
    ledger.assign(decision.instance_id, planned, now_s)


def _outcome(lines: list[Line], requests: list[SimulatedRequest],
             engines: list[GroundTruthInstance]) -> Outcome:
    by_id = {f"l{line.number}": line for line in lines}
    cached = [r.num_cached_tokens or 0 for r in requests]
    prefix_cached = [min(c, by_id[r.request_id].num_prefix_tokens)
                     for c, r in zip(cached, requests, strict=True)]
    finished = [r.finish_s for r in requests if r.finish_s is not None]
    assert len(finished) == len(lines), "a line never finished"
    return Outcome(
        hit_rate=sum(cached) / sum(r.num_prompt_tokens for r in requests),
        prefix_hit_rate=sum(prefix_cached) / sum(line.num_prefix_tokens for line in lines),
        done_s=max(finished),
        mean_e2e_s=sum(r.finish_s - r.arrival_s for r in requests  # type: ignore[operator]
                       ) / len(requests),
        num_preemptions=sum(e.num_preemptions for e in engines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--prefixes", type=int, default=20, help="shared system prompts")
    parser.add_argument("--prefix-tokens", type=int, default=1024)
    parser.add_argument("--suffix-min", type=int, default=100)
    parser.add_argument("--suffix-max", type=int, default=300)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--window", type=int, default=256, help="max_batch_in_flight")
    parser.add_argument("--release-interval", type=float, default=1.0,
                        help="batch_release_interval_s")
    parser.add_argument("--blocks", type=int, nargs="+", default=[7289, 3000],
                        help="KV-cache blocks (16 tokens) per instance, one run each")
    parser.add_argument("--policy", default="block")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not 1 <= args.suffix_min <= args.suffix_max or args.prefix_tokens < 1:
        parser.error("need 1 <= --suffix-min <= --suffix-max and --prefix-tokens >= 1")
    lines = make_batch(args)
    rows = []
    for num_blocks in args.blocks:
        for name, order in (("file", lines), ("prefix groups", grouped(lines))):
            outcome = run(lines, order, num_blocks, args)
            rows.append((str(num_blocks), name, f"{outcome.hit_rate:.1%}",
                         f"{outcome.prefix_hit_rate:.1%}", f"{outcome.done_s:.1f}",
                         f"{outcome.mean_e2e_s:.1f}", str(outcome.num_preemptions)))
    print_table(f"{args.lines} batch lines behind {args.prefixes} shared "
                f"{args.prefix_tokens}-token prompts (+{args.suffix_min}-{args.suffix_max} own "
                f"tokens), interleaved; window "
                f"{args.window}, {args.instances} instances x max_num_seqs 48, {args.policy} "
                f"router, Qwen2-7B/A30, seed {args.seed}",
                ("KV blocks", "release order", "prompt tokens cached",
                 "shared-prompt tokens cached", "batch done (s)", "mean e2e (s)", "preemptions"),
                rows, width=160)
    return 0
