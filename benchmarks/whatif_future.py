"""The what-if's blind spot alone, in simulated time: with and without the expected future load.

One instance is run step by step by the scheduler model (`workers.sim.Scheduler`, which
matches vLLM's own scheduler step for step: tests/workers/sim/test_vllm_parity.py) under
Poisson arrivals, its steps priced by an execution-time model. Each request, when it
reaches the scheduler, gets a what-if from the instance's state at that moment, with
its true output length and those of every request present (exact lengths: the Block*
setting) and the same execution-time model: the only thing the what-if does not know is
the requests that arrive after it. Its error against the request's simulated latency is
that blind spot alone, free of the machine's speed (the real-vLLM comparison,
scripts/bench_sim_fidelity.py, runs in real time). With ``--future-window-s W`` the
what-if also gets the expected future load (`FutureLoad`), estimated from the arrivals of
the W seconds before the request only.

Ranking: as in bench_sim_fidelity, every run also carries one shared stream of "probe"
requests (half the lowest rate), so each probe ran on two differently loaded instances;
the what-if routes it to the run where it predicts the shorter latency, and the second
table says how often that was the side that really finished it sooner, and the regret
(the chosen side's latency over the better side's, minus 1), with and without the term.

Setups: ``a30`` (the Block paper's A30 Qwen2-7B instance, model qwen2-7b-a30, ShareGPT
lengths; rates per instance) or ``tiny`` (bench_sim_fidelity's engine: block size 32,
80 KV blocks, max_num_seqs 48, 512-token budget, max_model_len 2048, halved ShareGPT
lengths, priced by a model fitted to the tiny Llama on CPU: ``--exec-model FILE``).

Usage::

    python scripts/bench_whatif_future.py [--setup a30] [--rates 1 2 3 4]
        [--future-window-s 5] [--duration-s 300] [--seed 0]
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.paths import DATA_DIR
from benchmarks.tables import pct, print_table, signed_pct
from workers.cluster_sim.workload import SHAREGPT
from workers.sim import (
    ExecModel,
    InstanceConfig,
    InstanceSnapshot,
    Scheduler,
    SeqState,
    SimRequest,
    bundled_model,
    estimate_future_load,
    predict_what_if,
)

DEFAULT_DATA_DIR = DATA_DIR
A30 = InstanceConfig(num_total_blocks=7289, block_size=16, max_num_seqs=48,
                     max_num_batched_tokens=512, max_model_len=4096)
TINY = InstanceConfig(num_total_blocks=80, block_size=32, max_num_seqs=48,
                      max_num_batched_tokens=512, max_model_len=2048)


@dataclass(frozen=True, slots=True)
class Outcome:
    request_id: str
    e2e_s: float  # simulated, from reaching the scheduler to the last token
    plain_s: float  # what-if without future load
    future_s: float  # what-if with it


def load_lengths(path: Path, max_model_len: int) -> list[tuple[int, int]]:
    scale = max_model_len / 4096
    with open(path, newline="") as handle:
        rows = [(int(r["num_prefill_tokens"]), int(r["num_decode_tokens"]))
                for r in csv.DictReader(handle)]
    scaled = [(max(2, round(p * scale)), max(1, round(d * scale))) for p, d in rows]
    return [(p, d) for p, d in scaled if p + d <= max_model_len]


def snapshot_of(scheduler: Scheduler, config: InstanceConfig) -> InstanceSnapshot:
    requests = [SimRequest(s.request_id, s.num_prompt_tokens, s.num_computed_tokens,
                           s.num_output_tokens, s.max_output_tokens, True)
                for s in scheduler.running]
    requests += [SimRequest(s.request_id, s.num_prompt_tokens, 0, s.num_output_tokens,
                            s.max_output_tokens, False) for s in scheduler.waiting]
    return InstanceSnapshot(config, scheduler.block_pool.num_free, tuple(requests))


def poisson(rng: random.Random, lengths: list[tuple[int, int]], rate: float, duration_s: float,
            prefix: str) -> list[tuple[float, str, int, int]]:
    arrivals, at = [], rng.expovariate(rate)
    while at < duration_s:
        arrivals.append((at, f"{prefix}{len(arrivals)}", *rng.choice(lengths)))
        at += rng.expovariate(rate)
    return arrivals


def run(arrivals: list[tuple[float, str, int, int]], config: InstanceConfig, model: ExecModel,
        window_s: float) -> list[Outcome]:
    arrivals = sorted(arrivals)
    scheduler = Scheduler(config)
    now, index = 0.0, 0
    history: list[tuple[float, int, int]] = []
    started: dict[str, tuple[float, float, float]] = {}  # id -> (start, plain, future)
    outcomes = []
    while index < len(arrivals) or scheduler.has_unfinished_requests:
        if not scheduler.has_unfinished_requests and arrivals[index][0] > now:
            now = arrivals[index][0]
        while index < len(arrivals) and arrivals[index][0] <= now:
            at, request_id, prompt, output = arrivals[index]
            snapshot = snapshot_of(scheduler, config)
            new = SimRequest(request_id, prompt, predicted_output_tokens=output)
            future = estimate_future_load(history, at, window_s, since=0.0)
            plain = predict_what_if(snapshot, new, model).e2e_s
            loaded = (predict_what_if(snapshot, new, model, future=future).e2e_s
                      if future.active else plain)
            started[request_id] = (now, plain, loaded)
            history.append((at, prompt, output))
            scheduler.add_request(SeqState(request_id, prompt, output))
            index += 1
        step = scheduler.step()
        now += model.step_ms(step.output.stats) / 1000.0
        for request_id in step.finished_ids:
            start, plain, loaded = started.pop(request_id)
            outcomes.append(Outcome(request_id, now - start, plain, loaded))
    return outcomes


def row(rate: float, outcomes: list[Outcome], warmup: int) -> tuple[str, ...]:
    kept = outcomes[warmup:]

    def errors(attr: str) -> list[float]:
        return [getattr(o, attr) / o.e2e_s - 1.0 for o in kept]

    plain, future = errors("plain_s"), errors("future_s")
    return (f"{rate:g}", str(len(kept)), f"{statistics.fmean(o.e2e_s for o in kept):.2f}",
            pct(statistics.median(abs(e) for e in plain)), signed_pct(statistics.median(plain)),
            pct(statistics.median(abs(e) for e in future)), signed_pct(statistics.median(future)))


def choices(left: list[Outcome], right: list[Outcome]) -> list[tuple[bool, float, bool, float]]:
    """Each shared probe routed between two runs: (right side chosen, regret) without and
    with the future-load term."""
    by_id = {o.request_id: o for o in right if o.request_id.startswith("p")}
    made = []
    for a in left:
        b = by_id.get(a.request_id)
        if b is None:
            continue
        best = min(a.e2e_s, b.e2e_s)
        row_ = []
        for chose_a in (a.plain_s <= b.plain_s, a.future_s <= b.future_s):
            chosen = a.e2e_s if chose_a else b.e2e_s
            row_ += [chose_a == (a.e2e_s <= b.e2e_s), chosen / best - 1.0]
        made.append(tuple(row_))
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", choices=["a30", "tiny"], default="a30")
    parser.add_argument("--exec-model", type=Path, help="fitted model JSON (setup tiny)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--rates", type=float, nargs="+", default=[1.0, 2.0, 3.0, 4.0])
    parser.add_argument("--future-window-s", type=float, default=5.0)
    parser.add_argument("--duration-s", type=float, default=300.0,
                        help="arrival window of each run (simulated seconds)")
    parser.add_argument("--warmup", type=int, default=20,
                        help="first finished requests left out (the instance filling up)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = A30 if args.setup == "a30" else TINY
    if args.setup == "tiny":
        if args.exec_model is None:
            parser.error("--setup tiny needs --exec-model")
        model = ExecModel.load(args.exec_model)
    else:
        model = bundled_model("qwen2-7b-a30")
    lengths = load_lengths(args.data / SHAREGPT, config.max_model_len)
    headers = ("rate req/s", "requests", "mean e2e s", "what-if e2e median", "bias",
               f"with future load ({args.future_window_s:g} s) median", "bias")
    started = time.monotonic()
    rng = random.Random(args.seed)
    probe_rate = 0.5 * min(args.rates)
    probes = poisson(rng, lengths, probe_rate, args.duration_s, "p")
    runs = [run(probes + poisson(rng, lengths, rate - probe_rate, args.duration_s, "b"),
                config, model, args.future_window_s) for rate in args.rates]
    print(f"setup {args.setup}, model {model.name}: |what-if - simulated| / simulated e2e")
    print_table("", headers, [row(rate, outcomes, args.warmup)
                              for rate, outcomes in zip(args.rates, runs, strict=True)],
                markdown=True)
    pairs = [(f"{a:g} vs {b:g}", choices(runs[i], runs[j]))
             for i, a in enumerate(args.rates) for j, b in enumerate(args.rates) if i < j]
    pairs.append(("all pairs", [c for _, made in pairs for c in made]))
    pairs = [(label, made) for label, made in pairs if made]  # one rate: no pair to rank
    print_table("", ("runs", "probes", "agreement", "mean regret", "agreement (future load)",
                     "mean regret (future load)"),
                [(label, str(len(made)),
                  pct(statistics.fmean(c[0] for c in made)),
                  pct(statistics.fmean(c[1] for c in made)),
                  pct(statistics.fmean(c[2] for c in made)),
                  pct(statistics.fmean(c[3] for c in made)))
                 for label, made in pairs], markdown=True)
    print(f"{time.monotonic() - started:.0f} s")
